// Helpers of the GPU tests: skip without a GPU, mirror a host test problem on
// the device (outputs poisoned, guard bytes around them), bring the results
// back, and judge them against the fp64 reference with bounds that allow for
// P being rounded to the input type before the PV product (as every
// tensor-core flash attention does).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "stsa/cuda.hpp"
#include "support/testing.hpp"

namespace stsa::gpu_testing {

// Skips without a usable GPU, except where the environment says one must be
// there (STSA_GPU_REQUIRED, set by bench/gpu/check.sh): then a missing device,
// a driver too old for the runtime and the like fail instead of passing as skips.
#define STSA_REQUIRE_GPU()                                                                        \
  do {                                                                                            \
    if (::stsa::cuda_device_count() == 0) {                                                       \
      if (std::getenv("STSA_GPU_REQUIRED") != nullptr)                                            \
        FAIL() << "STSA_GPU_REQUIRED is set, but no CUDA device: " << ::stsa::cuda_unavailable_reason(); \
      GTEST_SKIP() << "no CUDA device: " << ::stsa::cuda_unavailable_reason();                    \
    }                                                                                             \
  } while (0)

inline std::size_t tensor_bytes(const TensorView& t) { return std::size_t(t.numel()) * element_size(t.dtype); }

// A device allocation with kGuard sentinel bytes on both sides of the payload.
class GuardedDeviceBuffer {
 public:
  static constexpr std::size_t kGuard = 256;
  static constexpr unsigned char kSentinel = 0xA5;

  explicit GuardedDeviceBuffer(std::size_t payload) : payload_(payload), buffer_(payload + 2 * kGuard) {
    buffer_.fill_bytes(kSentinel);
  }
  void* data() const { return static_cast<unsigned char*>(buffer_.data()) + kGuard; }
  std::size_t payload() const { return payload_; }
  void poison() {  // 0xFF bytes are NaN in fp32, bf16 and fp16
    std::vector<unsigned char> nan(payload_, 0xFF);
    buffer_.copy_from_host(nan.data(), payload_, kGuard);
  }
  void upload(const void* host) { buffer_.copy_from_host(host, payload_, kGuard); }
  void download(void* host) const { buffer_.copy_to_host(host, payload_, kGuard); }
  bool guards_intact() const {
    std::vector<unsigned char> bytes(buffer_.bytes());
    buffer_.copy_to_host(bytes.data(), bytes.size());
    for (std::size_t i = 0; i < kGuard; ++i)
      if (bytes[i] != kSentinel || bytes[kGuard + payload_ + i] != kSentinel) return false;
    return true;
  }

 private:
  std::size_t payload_;
  DeviceBuffer buffer_;
};

// The device copy of a testing::Problem: same shapes and strides, device pointers.
struct DeviceProblem {
  GuardedDeviceBuffer q, k, v, o, lse;
  AttentionCall call;

  explicit DeviceProblem(const testing::Problem& p)
      : q(tensor_bytes(p.q.view())),
        k(tensor_bytes(p.k.view())),
        v(tensor_bytes(p.v.view())),
        o(tensor_bytes(p.o.view())),
        lse(std::size_t(p.layout.batch * p.layout.heads * p.layout.tokens()) * sizeof(float)),
        call(p.call()) {
    q.upload(p.q.view().data);
    k.upload(p.k.view().data);
    v.upload(p.v.view().data);
    o.poison();
    lse.poison();
    call.q.data = q.data();
    call.k.data = k.data();
    call.v.data = v.data();
    call.o.data = o.data();
    call.lse.data = static_cast<float*>(lse.data());
  }

  // Copies O and LSE into the problem's (guarded, host) output buffers.
  void download_into(testing::Problem& p) const {
    o.download(p.o.view().data);
    lse.download(p.lse.view().data);
  }
};

// Two device runs of one problem, the second without LSE: O the same to the
// bit, and the second run's (poisoned) LSE buffer never written.
inline void expect_same_output_and_no_lse(const DeviceProblem& with_lse, const DeviceProblem& without_lse) {
  std::vector<unsigned char> o_with(with_lse.o.payload()), o_without(without_lse.o.payload());
  with_lse.o.download(o_with.data());
  without_lse.o.download(o_without.data());
  EXPECT_EQ(std::memcmp(o_with.data(), o_without.data(), o_with.size()), 0) << "O differs without LSE";
  std::vector<float> lse(without_lse.lse.payload() / sizeof(float));
  without_lse.lse.download(lse.data());
  EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), [](float x) { return std::isnan(x); }))
      << "an LSE was written though none was asked for";
}

inline double max_abs(const TensorView& t) {
  double m = 0;
  for (std::int64_t b = 0; b < t.batch(); ++b)
    for (std::int64_t n = 0; n < t.tokens(); ++n)
      for (std::int64_t h = 0; h < t.heads(); ++h)
        for (std::int64_t d = 0; d < t.head_dim(); ++d) m = std::max(m, double(std::abs(t.load(b, n, h, d))));
  return m;
}

// The GPU's result (already downloaded into `p`) against the fp64 reference.
// O: twice the naive same-precision error plus the rounding of P (input type)
// and of O (output type), relative to the largest |v|. LSE comes from fp32
// scores, so its bound is tight: one key too many or too few moves it by about
// 1 / (kept keys of the row), far above 1e-4.
inline void expect_matches_reference(const testing::Problem& p, int sample_rows = 0) {
  const testing::Comparison c = testing::compare_with_reference(p, sample_rows, /*seed=*/7);
  const double u_p = unit_roundoff(p.dtype);
  const double u_o = unit_roundoff(p.o.view().dtype);
  const double o_bound = 2.0 * c.naive_max_abs_err + 2.0 * (u_p + u_o) * std::max(1.0, max_abs(p.v.view()));
  const double lse_bound = 2.0 * c.naive_lse_max_abs_err + 1e-4;
  const double rel_l2_bound = 2.0 * (u_p + u_o);
  const bool o_within = c.max_abs_err <= o_bound, rel_l2_within = c.rel_l2_err <= rel_l2_bound,
             lse_within = c.lse_max_abs_err <= lse_bound;
  EXPECT_TRUE(c.guards_intact) << p.label << ": host guard bytes overwritten";
  EXPECT_TRUE(c.all_finite_where_expected) << c.failure.substr(0, c.failure.find('\n'));  // its pattern is for the CPU bound
  EXPECT_TRUE(o_within) << p.label << ": max |O - ref| " << c.max_abs_err << " > " << o_bound << " (naive error "
                        << c.naive_max_abs_err << ")";
  EXPECT_TRUE(rel_l2_within) << p.label << ": rel L2 " << c.rel_l2_err << " > " << rel_l2_bound;
  EXPECT_TRUE(lse_within) << p.label << ": max |LSE - ref| " << c.lse_max_abs_err << " > " << lse_bound
                          << " (naive LSE error " << c.naive_lse_max_abs_err << ")";
  // One failed run on a GPU must say where to look: the pattern of what is wrong under these bounds.
  if (!(c.all_finite_where_expected && o_within && rel_l2_within && lse_within)) {
    const std::string pattern = testing::error_pattern(p.call(), c.reference, o_bound, lse_bound);
    ADD_FAILURE() << p.label << ": where the output is wrong\n"
                  << (pattern.empty() ? "  no single value past the bounds (the rel L2 error is)\n" : pattern);
  }
}

}  // namespace stsa::gpu_testing
