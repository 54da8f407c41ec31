// The NVML clock sampler (src/bench/nvml_clocks.hpp) against a stand-in
// library (fake_nvml.cpp) that checks every argument: opening by PCI bus id
// and by index, the board's limits, samples inside a window and none outside,
// readings that fail mid-run, and the reasons it cannot open. No GPU needed.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include "bench/nvml_clocks.hpp"

namespace stsa::bench {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

TEST(ClockSampler, ReadsTheBoardAndSamplesInsideTheWindow) {
  std::string why;
  auto sampler = ClockSampler::open("00000000:00:06.0", &why, FAKE_NVML_LIBRARY);
  ASSERT_NE(sampler, nullptr) << why;
  EXPECT_EQ(sampler->board().name, "Fake H200");
  EXPECT_EQ(sampler->board().max_sm_mhz, 1980);
  EXPECT_EQ(sampler->board().power_limit_w, 700);
  const double before = now_s();
  sampler->start(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  sampler->stop();
  const double after = now_s();
  EXPECT_EQ(sampler->error(), "");
  const auto all = sampler->summary(before, after);
  ASSERT_TRUE(all.has_value());
  EXPECT_GE(all->samples, 2);
  EXPECT_EQ(all->sm_mhz_mean, 1545);
  EXPECT_EQ(all->sm_mhz_min, 1545);
  EXPECT_EQ(all->power_w_mean, 688.5);
  EXPECT_EQ(all->power_capped_share, 1.0);  // the fake reports the software power cap
  EXPECT_FALSE(sampler->summary(after + 1, after + 2).has_value());  // no sample there: no figure
  EXPECT_FALSE(sampler->summary(before - 2, before - 1).has_value());
  sampler->stop();  // a second stop is harmless
}

TEST(ClockSampler, OpensDeviceZeroWithoutABusIdAndRefusesAnUnknownOne) {
  std::string why;
  EXPECT_NE(ClockSampler::open("", &why, FAKE_NVML_LIBRARY), nullptr) << why;
  EXPECT_EQ(ClockSampler::open("00000000:99:00.0", &why, FAKE_NVML_LIBRARY), nullptr);
  EXPECT_NE(why.find("no device 00000000:99:00.0"), std::string::npos) << why;
}

TEST(ClockSampler, SaysWhyWhenThereIsNoLibrary) {
  std::string why;
  EXPECT_EQ(ClockSampler::open("", &why, "libnvidia-ml-not-here.so.1"), nullptr);
  EXPECT_NE(why.find("cannot load libnvidia-ml-not-here.so.1"), std::string::npos) << why;
  // A library without the NVML calls.
  EXPECT_EQ(ClockSampler::open("", &why, "libm.so.6"), nullptr);
  EXPECT_NE(why.find("lacks one of the NVML calls"), std::string::npos) << why;
}

// Three failed readings between good ones are skipped and counted, and the
// sampling goes on; kMaxFailedReadingsInARow in a row end it.
TEST(ClockSampler, FailedReadingsAreSkippedAndEnoughInARowEndTheSampling) {
  std::string why;
  auto sampler = ClockSampler::open("", &why, FAKE_NVML_LIBRARY);
  ASSERT_NE(sampler, nullptr) << why;
  void* fake = dlopen(FAKE_NVML_LIBRARY, RTLD_NOW | RTLD_NOLOAD);  // the copy the sampler loaded
  ASSERT_NE(fake, nullptr);
  const auto fail_after = reinterpret_cast<void (*)(long)>(dlsym(fake, "fake_nvml_fail_clock_after"));
  const auto fail_times = reinterpret_cast<void (*)(long)>(dlsym(fake, "fake_nvml_fail_clock_times"));
  ASSERT_NE(fail_after, nullptr);
  ASSERT_NE(fail_times, nullptr);
  const auto wait_until = [](const auto& done) {
    for (int i = 0; i < 5000 && !done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return done();
  };
  fail_times(3);
  const double before = now_s();
  sampler->start(std::chrono::milliseconds(1));
  ASSERT_TRUE(wait_until([&] {
    const auto s = sampler->summary(before, now_s());
    return s && s->samples >= 2;
  }));
  EXPECT_EQ(sampler->failed_readings(), 3);
  EXPECT_EQ(sampler->error(), "nvmlDeviceGetClockInfo failed");
  fail_after(0);  // now every reading fails
  const int last = 3 + ClockSampler::kMaxFailedReadingsInARow;
  ASSERT_TRUE(wait_until([&] { return sampler->failed_readings() >= last; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(sampler->failed_readings(), last);  // the thread has ended: no more readings
  fail_after(-1);
  dlclose(fake);
}

TEST(ClockSampler, TensorPeakShareAtTheMeasuredClock) {
  // 132 SMs x 4096 FLOP per clock at 1.5 GHz = 811 TFLOP/s; half of it in 1 s is 0.5.
  const double peak = 132.0 * 4096 * 1.5e9;
  EXPECT_DOUBLE_EQ(tensor_peak_share(peak / 2, 1000.0, 1500, 132, 9, 0), 0.5);
  EXPECT_DOUBLE_EQ(tensor_peak_share(peak / 4, 1000.0, 1500, 132, 8, 0), 0.5);  // A100: half Hopper's per clock
  EXPECT_TRUE(std::isnan(tensor_peak_share(peak, 1000.0, 1500, 132, 8, 9)));   // not known
  EXPECT_TRUE(std::isnan(tensor_peak_share(peak, 1000.0, 0, 132, 9, 0)));      // no clock read
  EXPECT_TRUE(std::isnan(tensor_peak_share(peak, 0.0, 1500, 132, 9, 0)));
}

}  // namespace
}  // namespace stsa::bench
