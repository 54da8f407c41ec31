// The sm90 kernel's building blocks alone (src/cuda/sm90_probe.cu): TMA loads
// into the swizzled layout, S = Q K^T with both operands K-major from shared
// memory, O = P V with P from registers and V N-major. Checked against fp64
// products of the same bf16 values. When the attention tests fail on a Hopper
// GPU and these pass, the fault is in the pipeline or the softmax, not in the
// layouts; when these fail, the failing product says which descriptor is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/sm90_probe.hpp"
#include "gpu/gpu_support.hpp"
#include "stsa/cuda.hpp"
#include "stsa/dtype.hpp"

namespace stsa {
namespace {

constexpr int kRows = 128;

std::vector<std::uint16_t> random_bf16(std::size_t count, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<std::uint16_t> bits(count);
  for (auto& b : bits) b = float_to_bf16(normal(rng));
  return bits;
}

void probe(int head_dim) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::size_t tile = std::size_t(kRows) * std::size_t(head_dim);
  const auto q = random_bf16(tile, rng), k = random_bf16(tile, rng), v = random_bf16(tile, rng);
  const auto p = random_bf16(std::size_t(kRows) * kRows, rng);

  DeviceBuffer dq(tile * 2), dk(tile * 2), dv(tile * 2), dp(p.size() * 2);
  DeviceBuffer ds(std::size_t(kRows) * kRows * 4), dout(tile * 4);
  dq.copy_from_host(q.data(), tile * 2);
  dk.copy_from_host(k.data(), tile * 2);
  dv.copy_from_host(v.data(), tile * 2);
  dp.copy_from_host(p.data(), p.size() * 2);
  ds.fill_bytes(0xFF);  // NaN: every element must be written
  dout.fill_bytes(0xFF);
  cuda_detail::sm90_probe_products(dq.data(), dk.data(), dv.data(), dp.data(), static_cast<float*>(ds.data()),
                                   static_cast<float*>(dout.data()), head_dim);
  std::vector<float> s(std::size_t(kRows) * kRows), o(tile);
  ds.copy_to_host(s.data(), s.size() * 4);
  dout.copy_to_host(o.data(), o.size() * 4);

  // fp32 accumulation of exact bf16 products: error ~ terms * 2^-24 * magnitude.
  for (int i = 0; i < kRows; ++i)
    for (int j = 0; j < kRows; ++j) {
      double exact = 0, magnitude = 0;
      for (int d = 0; d < head_dim; ++d) {
        const double term = double(bf16_to_float(q[i * head_dim + d])) * bf16_to_float(k[j * head_dim + d]);
        exact += term;
        magnitude += std::abs(term);
      }
      ASSERT_NEAR(s[i * kRows + j], exact, 1e-5 * magnitude + 1e-6)
          << "S = Q K^T wrong at query " << i << ", key " << j << " (D " << head_dim << ")";
    }
  for (int i = 0; i < kRows; ++i)
    for (int d = 0; d < head_dim; ++d) {
      double exact = 0, magnitude = 0;
      for (int j = 0; j < kRows; ++j) {
        const double term = double(bf16_to_float(p[i * kRows + j])) * bf16_to_float(v[j * head_dim + d]);
        exact += term;
        magnitude += std::abs(term);
      }
      ASSERT_NEAR(o[i * head_dim + d], exact, 1e-5 * magnitude + 1e-6)
          << "O = P V wrong at row " << i << ", column " << d << " (D " << head_dim << ")";
    }
}

TEST(GpuSm90Probe, WgmmaProductsMatchTheirDefinition) {
  STSA_REQUIRE_GPU();
  const CudaDeviceInfo info = cuda_device_info();
  if (info.major != 9 || info.minor != 0) GTEST_SKIP() << "the sm90 probe needs compute capability 9.0";
  probe(128);
  probe(64);
}

}  // namespace
}  // namespace stsa
