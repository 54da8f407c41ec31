// routing_tiles.hpp's scores with AVX-512 VDPBF16PS, for CPUs without AMX
// tiles: the operands laid out as for the tiles, in vector registers. Each
// instruction multiplies 16 lanes of bf16 pairs (32 exact products) and adds
// them in fp32, twice the work of an fp32 FMA. A block of 8 rows x 32 keys
// keeps 16 accumulators in registers: the two key vectors loaded per pair of
// channels serve all 8 rows.
#include "cpu/intrinsics.hpp"

#include "cpu/routing_tiles.hpp"

namespace stsa::cpu {
namespace {

static_assert(kRoutingPanelKeys == 32, "a panel's keys are two vectors of 16 lanes");
constexpr int kScoreRows = 8;

inline __m512 dot(__m512 acc, std::uint32_t pair, __m512i pairs) {
  return _mm512_dpbf16_ps(acc, __m512bh(_mm512_set1_epi32(int(pair))), __m512bh(pairs));
}

}  // namespace

void routing_scores_avx512(const std::uint32_t* q, const std::uint32_t* kt, int rows, int keys, int head_dim,
                           float* s, int s_stride) {
  const int pairs = head_dim / 2;
  for (int n0 = 0; n0 < keys; n0 += kRoutingPanelKeys) {
    const std::uint32_t* panel = kt + std::int64_t(n0 / kRoutingPanelKeys) * pairs * kRoutingPanelKeys;
    for (int r0 = 0; r0 < rows; r0 += kScoreRows) {
      const std::uint32_t* q_rows = q + std::int64_t(r0) * pairs;
      __m512 sum[kScoreRows][2];
      for (auto& row : sum) row[0] = row[1] = _mm512_setzero_ps();
      for (int p = 0; p < pairs; ++p) {
        const __m512i first = _mm512_loadu_si512(panel + std::int64_t(p) * kRoutingPanelKeys);
        const __m512i second = _mm512_loadu_si512(panel + std::int64_t(p) * kRoutingPanelKeys + 16);
        for (int r = 0; r < kScoreRows; ++r) {
          const std::uint32_t pair = q_rows[std::int64_t(r) * pairs + p];
          sum[r][0] = dot(sum[r][0], pair, first);
          sum[r][1] = dot(sum[r][1], pair, second);
        }
      }
      for (int r = 0; r < kScoreRows; ++r) {
        float* at = s + std::int64_t(r0 + r) * s_stride + n0;
        _mm512_storeu_ps(at, sum[r][0]);
        _mm512_storeu_ps(at + 16, sum[r][1]);
      }
    }
  }
}

}  // namespace stsa::cpu
