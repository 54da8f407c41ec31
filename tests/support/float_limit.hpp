// The values that put scores at the float limit, shared by the tests (testing.cpp's
// plant_scores_at_the_float_limit) and the attention fuzzer: header-only, since the fuzzer
// links the library's rooms but not the tests' helpers.
#pragma once

#include <cstdint>
#include <random>

#include "stsa/tensor.hpp"

namespace stsa::testing {

// Channel 0 of q is +2^64 on tokens n % 3 == 1, -2^64 on n % 3 == 2 and 0 on the others; channel 0
// of every key is 2^63 x [1.5, 1.8], in the 39 bf16 steps there (exact in bf16 and fp32). Q K^T then
// reaches +-(2.6-3.1)e38: finite in fp32, past FLT_MAX once times log2 e. Every (b, n, h) of q's
// shape, in that order, one draw of `rng` each; nothing for a head dim of 0.
inline void store_float_limit_channels(const TensorView& q, const TensorView& k, std::mt19937_64& rng) {
  constexpr float kQuery[3] = {0.0f, 0x1p64f, -0x1p64f};
  std::uniform_int_distribution<int> step(0, 38);
  if (q.head_dim() == 0) return;
  for (std::int64_t b = 0; b < q.shape[0]; ++b)
    for (std::int64_t n = 0; n < q.shape[1]; ++n) {
      for (std::int64_t h = 0; h < q.shape[2]; ++h) q.store(b, n, h, 0, kQuery[n % 3]);
      for (std::int64_t h = 0; h < k.shape[2]; ++h)  // k's own heads (fewer where grouped)
        k.store(b, n, h, 0, 0x1p63f * (1.5f + 0x1p-7f * float(step(rng))));
    }
}

}  // namespace stsa::testing
