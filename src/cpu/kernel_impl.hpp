// The attention kernel, written once over a small vector interface and compiled
// once per instruction set (kernel_scalar.cpp, kernel_avx2.cpp,
// kernel_avx512.cpp). Each of those defines, inside an anonymous namespace and
// before including this file:
//
//   struct Vec {            // one SIMD register of W floats
//     static constexpr int W;
//     using reg;
//     load, store, zero, set1, fmadd(a, b, c) = a * b + c, mul, sub, max,
//     reduce_max, reduce_add, exp2 (0 for -inf, NaN for NaN),
//     select(bits, x, fill)  // lane i: bit i of bits ? x : fill
//     kHasBf16Dot            // true: also load_pairs(p) and dot_pairs(acc, pair, pairs) =
//                            //   acc + a.lo * b.lo + a.hi * b.hi per lane (bf16 pairs, fp32 sums),
//                            //   round_to_pairs(lo, hi) (2W floats to W pairs of bf16), store_pairs
//                            //   and exp2_for_bf16 (exp2 accurate to what bf16 rounding keeps)
//   };
//   constexpr int kQkRows, kQkVecs;   // S = Q K^T register block: rows x (vecs * W) columns
//   constexpr int kPvAccumulators, kPvMaxVecs;  // O += P V register budget
//   constexpr int kSoftmaxRows;       // rows whose softmax passes are interleaved
//
// so that nothing here has external linkage (see kernel.hpp for why).
//
// Per query tile, per listed key tile (full ones first, then partial ones, as
// the plan orders them), per block of kScratchRows rows:
//   S = Q K^T            (Q only sign-adjusted: the softmax scale goes into exp2)
//   mask S               (partial tiles and the ragged last key tile only)
//   online softmax       (running max m, running sum l, rescale O rows)
//   O += P V
// Every row is computed by one call in a fixed order, so results do not depend
// on how rows are grouped into blocks or spread over threads.
//
// Probabilities are exp2((s - m) * |scale| * log2 e) rather than exp2(s' - m')
// with Q pre-scaled by scale * log2 e: the rounding error of the exponent's
// argument is then relative to s - m (small for the keys that matter), not to s,
// and bf16 products stay exact, which keeps rows with few keys within 2x of a
// naive fp32 softmax (measured: pre-scaling gave up to 3x).

constexpr float kNegInf = -__builtin_inff();

template <int kD>
struct PvShape {
  static constexpr int kDVecs = kD / Vec::W;  // vectors per row of O
  static constexpr int pick_vecs() {
    for (int n = kPvMaxVecs; n >= 1; --n)
      if (kDVecs % n == 0) return n;
    return 1;
  }
  static constexpr int kVecs = pick_vecs();  // vectors per register block (divides the row)
  static constexpr int kRows = kPvAccumulators / kVecs < 8 ? kPvAccumulators / kVecs : 8;
};

// S[Mr rows][kQkVecs * W cols] = Q[Mr rows][kD] . Kt[kD][cols]
template <int kD, int Mr>
inline void qk_block(const float* q, const float* kt, int kt_stride, float* s, int s_stride) {
  typename Vec::reg acc[Mr][kQkVecs];
  for (int i = 0; i < Mr; ++i)
    for (int j = 0; j < kQkVecs; ++j) acc[i][j] = Vec::zero();
  for (int d = 0; d < kD; ++d) {
    typename Vec::reg kv[kQkVecs];
    for (int j = 0; j < kQkVecs; ++j) kv[j] = Vec::load(kt + d * kt_stride + j * Vec::W);
    for (int i = 0; i < Mr; ++i) {
      const typename Vec::reg qb = Vec::set1(q[i * kD + d]);
      for (int j = 0; j < kQkVecs; ++j) acc[i][j] = Vec::fmadd(qb, kv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < Mr; ++i)
    for (int j = 0; j < kQkVecs; ++j) Vec::store(s + i * s_stride + j * Vec::W, acc[i][j]);
}

// Rows [0, rows) of S over the first `cols` columns (a multiple of kQkVecs * W).
template <int kD, int Mr>
inline void qk_rows(const float* q, int rows, const float* kt, int tile_k, int cols, float* s) {
  constexpr int kCols = kQkVecs * Vec::W;
  int r = 0;
  for (; r + Mr <= rows; r += Mr)
    for (int c = 0; c < cols; c += kCols) qk_block<kD, Mr>(q + r * kD, kt + c, tile_k, s + r * tile_k + c, tile_k);
  if constexpr (Mr > 1) {
    if (r < rows) qk_rows<kD, Mr - 1>(q + r * kD, rows - r, kt, tile_k, cols, s + r * tile_k);
  }
}

// The same from bf16 pairs (QueryTileJob::q_pairs): q row i at q + i * kD / 2,
// key-panel pair row d2 at kt + d2 * kt_stride; half the instructions of qk_block.
// V is a template parameter so that ISAs without the dot product never see it.
template <class V, int kD, int Mr>
inline void qk_block_bf16(const std::uint32_t* q, const std::uint32_t* kt, int kt_stride, float* s, int s_stride) {
  typename V::reg acc[Mr][kQkVecs];
  for (int i = 0; i < Mr; ++i)
    for (int j = 0; j < kQkVecs; ++j) acc[i][j] = V::zero();
  for (int d2 = 0; d2 < kD / 2; ++d2) {
    typename V::pairs kv[kQkVecs];
    for (int j = 0; j < kQkVecs; ++j) kv[j] = V::load_pairs(kt + d2 * kt_stride + j * V::W);
    for (int i = 0; i < Mr; ++i)
      for (int j = 0; j < kQkVecs; ++j) acc[i][j] = V::dot_pairs(acc[i][j], q[i * (kD / 2) + d2], kv[j]);
  }
  for (int i = 0; i < Mr; ++i)
    for (int j = 0; j < kQkVecs; ++j) V::store(s + i * s_stride + j * V::W, acc[i][j]);
}

template <class V, int kD, int Mr>
inline void qk_rows_bf16(const std::uint32_t* q, int rows, const std::uint32_t* kt, int tile_k, int cols, float* s) {
  constexpr int kCols = kQkVecs * V::W;
  int r = 0;
  for (; r + Mr <= rows; r += Mr)
    for (int c = 0; c < cols; c += kCols)
      qk_block_bf16<V, kD, Mr>(q + r * (kD / 2), kt + c, tile_k, s + r * tile_k + c, tile_k);
  if constexpr (Mr > 1) {
    if (r < rows) qk_rows_bf16<V, kD, Mr - 1>(q + r * (kD / 2), rows - r, kt, tile_k, cols, s + r * tile_k);
  }
}

// O[Mr rows][kVecs * W at d0] += P[Mr rows][0, cols) . V[0, cols)[d0 ...]
// The tile's products are summed on their own, then added to O: a row's sum is
// then a chain of one tile's keys and one add per tile, not of all N keys
// (rel L2 error of a dense fp32 call at 5,376 tokens: 1.37e-6 -> 4.7e-7, PyTorch's
// CPU attention 5.2e-7).
template <int kD, int Mr, int kVecs>
inline void pv_block(const float* p, int p_stride, const float* v, int cols, float* o) {
  typename Vec::reg acc[Mr][kVecs];
  for (int i = 0; i < Mr; ++i)
    for (int j = 0; j < kVecs; ++j) acc[i][j] = Vec::zero();
  for (int c = 0; c < cols; ++c) {
    typename Vec::reg vv[kVecs];
    for (int j = 0; j < kVecs; ++j) vv[j] = Vec::load(v + c * kD + j * Vec::W);
    for (int i = 0; i < Mr; ++i) {
      const typename Vec::reg pb = Vec::set1(p[i * p_stride + c]);
      for (int j = 0; j < kVecs; ++j) acc[i][j] = Vec::fmadd(pb, vv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < Mr; ++i)
    for (int j = 0; j < kVecs; ++j) {
      float* at = o + i * kD + j * Vec::W;
      Vec::store(at, Vec::add(Vec::load(at), acc[i][j]));
    }
}

template <int kD, int Mr>
inline void pv_rows(const float* p, int p_stride, int rows, const float* v, int cols, float* o) {
  constexpr int kVecs = PvShape<kD>::kVecs;
  constexpr int kChunk = kVecs * Vec::W;
  int r = 0;
  for (; r + Mr <= rows; r += Mr)
    for (int d0 = 0; d0 < kD; d0 += kChunk)
      pv_block<kD, Mr, kVecs>(p + r * p_stride, p_stride, v + d0, cols, o + r * kD + d0);
  if constexpr (Mr > 1) {
    if (r < rows) pv_rows<kD, Mr - 1>(p + r * p_stride, p_stride, rows - r, v, cols, o + r * kD);
  }
}

// pv_block from bf16 pairs: P's pairs of keys (exp_to_pairs) times V's
// (KvPanels::v_pairs: pair row c2 holds keys 2 c2 and 2 c2 + 1 of every channel,
// at v + c2 * kD), key_pairs of them; half the instructions of pv_block.
template <class V, int kD, int Mr, int kVecs>
inline void pv_block_bf16(const std::uint32_t* p, int p_stride, const std::uint32_t* v, int key_pairs, float* o) {
  typename V::reg acc[Mr][kVecs];
  for (int i = 0; i < Mr; ++i)
    for (int j = 0; j < kVecs; ++j) acc[i][j] = V::zero();
  for (int c2 = 0; c2 < key_pairs; ++c2) {
    typename V::pairs vv[kVecs];
    for (int j = 0; j < kVecs; ++j) vv[j] = V::load_pairs(v + c2 * kD + j * V::W);
    for (int i = 0; i < Mr; ++i)
      for (int j = 0; j < kVecs; ++j) acc[i][j] = V::dot_pairs(acc[i][j], p[i * p_stride + c2], vv[j]);
  }
  for (int i = 0; i < Mr; ++i)
    for (int j = 0; j < kVecs; ++j) {
      float* at = o + i * kD + j * V::W;
      V::store(at, V::add(V::load(at), acc[i][j]));
    }
}

template <class V, int kD, int Mr>
inline void pv_rows_bf16(const std::uint32_t* p, int p_stride, int rows, const std::uint32_t* v, int key_pairs,
                         float* o) {
  constexpr int kVecs = PvShape<kD>::kVecs;
  constexpr int kChunk = kVecs * V::W;
  int r = 0;
  for (; r + Mr <= rows; r += Mr)
    for (int d0 = 0; d0 < kD; d0 += kChunk)
      pv_block_bf16<V, kD, Mr, kVecs>(p + r * p_stride, p_stride, v + d0, key_pairs, o + r * kD + d0);
  if constexpr (Mr > 1) {
    if (r < rows) pv_rows_bf16<V, kD, Mr - 1>(p + r * p_stride, p_stride, rows - r, v, key_pairs, o + r * kD);
  }
}

// Slow path for a partial tile whose V holds Inf/NaN: skip masked columns
// instead of multiplying them by 0, so rows that never see them stay finite.
template <int kD>
inline void pv_rows_skipping_masked(const float* p, int p_stride, int rows, const float* v, int cols, float* o,
                                    const std::uint64_t* mask, int mask_words) {
  for (int i = 0; i < rows; ++i) {
    const std::uint64_t* bits = mask + std::int64_t(i) * mask_words;
    for (int c = 0; c < cols; ++c) {
      if (((bits[c >> 6] >> (c & 63)) & 1u) == 0) continue;
      const typename Vec::reg pb = Vec::set1(p[i * p_stride + c]);
      for (int d = 0; d < kD; d += Vec::W)
        Vec::store(o + i * kD + d, Vec::fmadd(pb, Vec::load(v + c * kD + d), Vec::load(o + i * kD + d)));
    }
  }
}

// The columns [begin, end) of a partial tile that some of `rows` mask rows
// allow: begin a multiple of 64 (a whole mask word, so the mask can be read from
// there on), end rounded up to `align` and at most `cols`; begin >= end: none.
// Every row masks the columns outside, so leaving them out changes no value:
// they would add exp2(-inf) = 0 to l and 0 x V to O. At low densities most kept
// tiles are partial, and a narrow band's rows allow about half of such a tile.
struct ColumnSpan {
  int begin = 0, end = 0;
};
inline ColumnSpan allowed_columns(const std::uint64_t* mask, int mask_words, int rows, int cols, int align) {
  int lowest = -1, highest = -1;
  for (int w = 0; w < mask_words; ++w) {
    std::uint64_t any = 0;
    for (int i = 0; i < rows; ++i) any |= mask[std::int64_t(i) * mask_words + w];
    if (any == 0) continue;
    if (lowest < 0) lowest = w * 64 + __builtin_ctzll(any);
    highest = w * 64 + 63 - __builtin_clzll(any);
  }
  if (lowest < 0) return {};
  const int end = (highest + align) / align * align;
  return {lowest / 64 * 64, end < cols ? end : cols};
}

// A partial tile's columns [begin, begin + cols) for a block of rows (begin 0 and
// cols the whole tile on entry) narrowed to allowed_columns, with the block's
// mask advanced to `begin`; false when the rows allow no key before the sequence
// ends (valid_cols): the block then skips the tile.
inline bool narrow_to_allowed(const std::uint64_t*& mask, int mask_words, int rows, int valid_cols, int align,
                              int& begin, int& cols) {
  const ColumnSpan span = allowed_columns(mask, mask_words, rows, cols, align);
  if (span.begin >= span.end || span.begin >= valid_cols) return false;
  begin = span.begin;
  cols = span.end - span.begin;
  mask += begin / 64;
  return true;
}

// Lane bits of vector j (columns j*W ...) from a bitmask row; all ones when mask is null.
inline unsigned lane_bits(const std::uint64_t* mask_row, int j) {
  constexpr unsigned kAll = Vec::W >= 32 ? ~0u : (1u << Vec::W) - 1u;
  if (mask_row == nullptr) return kAll;
  const int bit = j * Vec::W;
  return unsigned(mask_row[bit >> 6] >> (bit & 63)) & kAll;
}

// Lanes of vector j that lie before column `valid_cols`.
inline unsigned limit_bits(int j, int valid_cols) {
  const int n = valid_cols - j * Vec::W;
  if (n >= Vec::W) return Vec::W >= 32 ? ~0u : (1u << Vec::W) - 1u;
  return n <= 0 ? 0u : (1u << n) - 1u;
}

// The exponentials of kGroup rows from row i0, rounded to nearest bf16 as pairs of neighbouring
// keys: row i's columns [0, cols) (a multiple of 2W) become words [0, cols / 2) at p_pairs + i *
// p_stride, with no fp32 P stored and read again; summed into `sum` in the fp32 path's order.
template <class V, int kGroup>
inline void exp_to_pairs(const float* s, int s_stride, int i0, int cols, const typename V::reg* shift,
                         typename V::reg vscale, typename V::reg* sum, std::uint32_t* p_pairs, int p_stride) {
  for (int j = 0; j * V::W < cols; j += 2)
    for (int g = 0; g < kGroup; ++g) {
      const float* at = s + (i0 + g) * s_stride + j * V::W;
      const typename V::reg lo = V::exp2_for_bf16(V::mul(V::sub(V::load(at), shift[g]), vscale));
      const typename V::reg hi = V::exp2_for_bf16(V::mul(V::sub(V::load(at + V::W), shift[g]), vscale));
      sum[g] = V::add(V::add(sum[g], lo), hi);
      V::store_pairs(p_pairs + (i0 + g) * p_stride + j * V::W / 2, V::round_to_pairs(lo, hi));
    }
}

// The softmax of kGroup rows from row i0, their passes interleaved: a row's max
// and sum are chains of dependent ops, and its exponentials wait for its max, so
// rows taken one at a time ran at the chains' latency (18 cycles per 16 scores on
// AVX-512, against ~11 for the ops). Leaves in max_drop and tile_sum what
// softmax_rows needs to update l and O. kPairs: P goes to p_pairs as bf16 pairs
// (exp_to_pairs), S left as the masked scores.
template <bool kMasked, int kGroup, bool kPairs>
inline void softmax_group(float* s, int s_stride, int i0, int cols, int valid_cols, const std::uint64_t* mask,
                          int mask_words, float exp_scale, float* m, float* max_drop, float* tile_sum,
                          std::uint32_t* p_pairs, int p_stride) {
  const typename Vec::reg neg_inf = Vec::set1(kNegInf);
  typename Vec::reg vmax[kGroup];
  for (int g = 0; g < kGroup; ++g) vmax[g] = neg_inf;
  for (int j = 0; j * Vec::W < cols; ++j)
    for (int g = 0; g < kGroup; ++g) {
      float* at = s + (i0 + g) * s_stride + j * Vec::W;
      if constexpr (kMasked) {
        const std::uint64_t* mask_row = mask ? mask + std::int64_t(i0 + g) * mask_words : nullptr;
        const unsigned bits = lane_bits(mask_row, j) & limit_bits(j, valid_cols);
        const typename Vec::reg x = Vec::select(bits, Vec::load(at), neg_inf);
        Vec::store(at, x);
        vmax[g] = Vec::max(vmax[g], x);
      } else {
        vmax[g] = Vec::max(vmax[g], Vec::load(at));
      }
    }
  typename Vec::reg shift[kGroup];  // subtracted from the scores: the new max
  bool allowed[kGroup];
  for (int g = 0; g < kGroup; ++g) {
    const float tile_max = Vec::reduce_max(vmax[g]);
    const float m_old = m[i0 + g];
    const float m_new = tile_max > m_old ? tile_max : m_old;
    // No key allowed yet (m_new = -inf): shifting by +inf makes every score 0 but
    // a NaN one (which can hide from the max), so l and O become NaN if there is one.
    allowed[g] = m_new != kNegInf;
    shift[g] = Vec::set1(allowed[g] ? m_new : __builtin_inff());
    max_drop[i0 + g] = allowed[g] ? m_old - m_new : 0.0f;
    if (allowed[g]) m[i0 + g] = m_new;
  }
  const typename Vec::reg vscale = Vec::set1(exp_scale);
  typename Vec::reg sum[kGroup];
  for (int g = 0; g < kGroup; ++g) sum[g] = Vec::zero();
  if constexpr (kPairs) {
    exp_to_pairs<Vec, kGroup>(s, s_stride, i0, cols, shift, vscale, sum, p_pairs, p_stride);
  } else {
    for (int j = 0; j * Vec::W < cols; ++j)
      for (int g = 0; g < kGroup; ++g) {
        float* at = s + (i0 + g) * s_stride + j * Vec::W;
        const typename Vec::reg p = Vec::exp2(Vec::mul(Vec::sub(Vec::load(at), shift[g]), vscale));
        Vec::store(at, p);
        sum[g] = Vec::add(sum[g], p);
      }
  }
  for (int g = 0; g < kGroup; ++g) tile_sum[i0 + g] = Vec::reduce_add(sum[g]);
}

// Online-softmax update of `rows` (<= kScratchRows) rows of S (in place: S becomes P).
// kMasked: apply the partial-tile mask (may be null) and the ragged column limit.
// Each row's rescale factor exp2((m_old - m_new) * exp_scale) is taken after the
// row loop, W rows per vector exp2: a libm call per row (with the vector state it
// must save) cost as much as the exponentials of a 128-column row.
// kPairs: P written to p_pairs as bf16 pairs (p_stride words a row) instead of into S.
template <int kD, bool kMasked, bool kPairs = false>
inline void softmax_rows(float* s, int s_stride, int rows, int cols, int valid_cols, const std::uint64_t* mask,
                         int mask_words, float exp_scale, float* m, float* l, float* o,
                         std::uint32_t* p_pairs = nullptr, int p_stride = 0) {
  constexpr int kLanes = (kScratchRows + Vec::W - 1) / Vec::W * Vec::W;
  float max_drop[kLanes];  // m_old - m_new: -inf for a row's first allowed keys, 0 keeps l and O
  float tile_sum[kLanes];  // this tile's share of l
  int i = 0;
  for (; i + kSoftmaxRows <= rows; i += kSoftmaxRows)
    softmax_group<kMasked, kSoftmaxRows, kPairs>(s, s_stride, i, cols, valid_cols, mask, mask_words, exp_scale, m,
                                                 max_drop, tile_sum, p_pairs, p_stride);
  for (; i < rows; ++i)
    softmax_group<kMasked, 1, kPairs>(s, s_stride, i, cols, valid_cols, mask, mask_words, exp_scale, m, max_drop,
                                      tile_sum, p_pairs, p_stride);
  for (i = rows; i < kLanes; ++i) max_drop[i] = 0.0f;
  float alpha[kLanes];
  const typename Vec::reg vscale = Vec::set1(exp_scale);
  for (i = 0; i < rows; i += Vec::W) Vec::store(alpha + i, Vec::exp2(Vec::mul(Vec::load(max_drop + i), vscale)));
  for (i = 0; i < rows; ++i) {
    l[i] = l[i] * alpha[i] + tile_sum[i];  // alpha: 0 when m_old = -inf, 1 when the max held
    if (alpha[i] != 1.0f) {
      const typename Vec::reg va = Vec::set1(alpha[i]);
      float* orow = o + i * kD;
      for (int d = 0; d < kD; d += Vec::W) Vec::store(orow + d, Vec::mul(Vec::load(orow + d), va));
    }
  }
}

// softmax_rows with the mask work chosen at run time: `masked` (a partial tile, or the ragged
// last one) applies `mask` (may be null) and the column limit; otherwise neither is read.
template <int kD, bool kPairs = false>
inline void softmax_block(bool masked, float* s, int s_stride, int rows, int cols, int valid_cols,
                          const std::uint64_t* mask, int mask_words, float exp_scale, float* m, float* l, float* o,
                          std::uint32_t* p_pairs = nullptr, int p_stride = 0) {
  if (masked)
    softmax_rows<kD, true, kPairs>(s, s_stride, rows, cols, valid_cols, mask, mask_words, exp_scale, m, l, o, p_pairs,
                                   p_stride);
  else
    softmax_rows<kD, false, kPairs>(s, s_stride, rows, cols, valid_cols, nullptr, 0, exp_scale, m, l, o, p_pairs,
                                    p_stride);
}

template <int kD>
void attend(const QueryTileJob& job) {
  constexpr int kQkCols = kQkVecs * Vec::W;
  for (int i = 0; i < job.rows; ++i) {
    job.m[i] = kNegInf;
    job.l[i] = 0.0f;
  }
  for (std::int64_t i = 0; i < std::int64_t(job.rows) * kD; ++i) job.o[i] = 0.0f;

  const int tile_k = job.tile_k;
  const int n_tiles = job.n_full + job.n_partial;
  // P V from bf16 pairs (QueryTileJob::p_pairs); not for V with Inf or NaN (a masked
  // column must be skipped, not multiplied by 0) or with values VDPBF16PS would flush.
  const bool bf16_pv = job.p_pairs != nullptr && !job.kv.v_nonfinite && !job.kv.v_tiny;
  for (int n = 0; n < n_tiles; ++n) {
    const bool partial = n >= job.n_full;
    const std::int32_t tile = partial ? job.partial[n - job.n_full] : job.full[n];
    const std::uint64_t* mask = partial ? job.partial_masks[n - job.n_full] : nullptr;
    const std::int64_t c0 = std::int64_t(tile) * tile_k;
    const int valid_cols = int(job.tokens - c0 < tile_k ? job.tokens - c0 : tile_k);
    const int tile_cols = (valid_cols + kQkCols - 1) / kQkCols * kQkCols;  // scores computed (zero-padded K)
    const bool masked = partial || valid_cols < tile_k;

    for (int r0 = 0; r0 < job.rows; r0 += kScratchRows) {
      const int rows = job.rows - r0 < kScratchRows ? job.rows - r0 : kScratchRows;
      const std::uint64_t* block_mask = mask ? mask + std::int64_t(r0) * job.mask_words : nullptr;
      // Columns [begin, begin + cols) of the tile; past `valid` of them, the sequence has ended.
      int begin = 0, cols = tile_cols;
      if (partial && !narrow_to_allowed(block_mask, job.mask_words, rows, valid_cols, kQkCols, begin, cols)) continue;
      const int valid = valid_cols - begin;
      const float* v = job.kv.v + (c0 + begin) * kD;
      float* s = job.scratch + begin;
      float* o = job.o + std::int64_t(r0) * kD;
      bool scored = false;
      if constexpr (Vec::kHasBf16Dot) {
        if (job.q_pairs != nullptr) {
          qk_rows_bf16<Vec, kD, kQkRows>(job.q_pairs + std::int64_t(r0) * (kD / 2), rows,
                                         job.kv.kt_pairs + std::int64_t(tile) * (kD / 2) * tile_k + begin, tile_k,
                                         cols, s);
          scored = true;
        }
      }
      // (kt is null when K was packed as bf16 pairs only: no offset from it before it is known to be there.)
      if (!scored)
        qk_rows<kD, kQkRows>(job.q + std::int64_t(r0) * kD, rows,
                             job.kv.kt + std::int64_t(tile) * kD * tile_k + begin, tile_k, cols, s);
      const int keys = valid < cols ? valid : cols;
      if constexpr (Vec::kHasBf16Dot) {
        if (bf16_pv) {
          // P straight to bf16 pairs. Past the sequence's end it is 0 (masked) and so is V there: an odd
          // key count takes its pair whole.
          softmax_block<kD, true>(masked, s, tile_k, rows, cols, valid, block_mask, job.mask_words, job.exp_scale,
                                  job.m + r0, job.l + r0, o, job.p_pairs, tile_k / 2);
          pv_rows_bf16<Vec, kD, PvShape<kD>::kRows>(
              job.p_pairs, tile_k / 2, rows, job.kv.v_pairs + std::int64_t(tile) * (tile_k / 2) * kD + begin / 2 * kD,
              (keys + 1) / 2, o);
          continue;
        }
      }
      softmax_block<kD>(masked, s, tile_k, rows, cols, valid, block_mask, job.mask_words, job.exp_scale, job.m + r0,
                        job.l + r0, o);
      if (partial && job.kv.v_nonfinite)
        pv_rows_skipping_masked<kD>(s, tile_k, rows, v, keys, o, block_mask, job.mask_words);
      else
        pv_rows<kD, PvShape<kD>::kRows>(s, tile_k, rows, v, keys, o);
    }
  }
}

inline AttendFn attend_for(int head_dim) {
  switch (head_dim) {
    case 64: return &attend<64>;
    case 80: return &attend<80>;
    case 96: return &attend<96>;
    case 128: return &attend<128>;
    default: return nullptr;
  }
}
