// The NVML clock sampler (src/bench/nvml_clocks.hpp) against a stand-in
// library (fake_nvml.cpp) that checks every argument: opening by PCI bus id
// and by index, the board's limits, samples inside a window and none outside,
// a reading that fails mid-run, and the reasons it cannot open. No GPU needed.
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

TEST(ClockSampler, AReadingThatFailsEndsTheSamplingAndIsKept) {
  // The fake's clock reading fails after the first reading in open() and three samples.
  std::string why;
  auto sampler = ClockSampler::open("", &why, FAKE_NVML_LIBRARY);
  ASSERT_NE(sampler, nullptr) << why;
  void* fake = dlopen(FAKE_NVML_LIBRARY, RTLD_NOW | RTLD_NOLOAD);  // the copy the sampler loaded
  ASSERT_NE(fake, nullptr);
  const auto fail_after = reinterpret_cast<void (*)(long)>(dlsym(fake, "fake_nvml_fail_clock_after"));
  ASSERT_NE(fail_after, nullptr);
  fail_after(3);
  const double before = now_s();
  sampler->start(std::chrono::milliseconds(1));
  for (int i = 0; i < 2000 && sampler->error().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(sampler->error(), "nvmlDeviceGetClockInfo failed");
  const auto kept = sampler->summary(before, now_s());
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->samples, 3);
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
