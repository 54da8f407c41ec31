// Moving data between the caller's strided tensors (fp32, bf16 or f16, any
// strides) and the contiguous fp32 panels the kernels read and write.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

#include "stsa/cpu.hpp"
#include "stsa/tensor.hpp"

namespace stsa::cpu {

// Above any head dim a kernel is built for (the backend's search for one stops here);
// row buffers on the stack are this long.
inline constexpr std::int64_t kMaxHeadDim = 1024;

// The largest (padded) head dim pack_pairs_tile_amx takes (its stack rows are this
// long). The router's tile path, built on it, stops here too: larger heads take
// the router's fp32 path.
inline constexpr int kMaxPairPanelDim = 512;

// A head dim the kernels are not built for runs padded to one they are (the
// backend's kernel dim: the next larger one): the `kernel_dim` arguments below
// write that many channels, the head's, then zeros, which add nothing to a score
// (0 or less: the head dim itself).

// The helpers below (loaders, packers, stores) use the widest vector instructions the
// CPU has, up to a cap: the call's instruction set, so that a kernel capped at AVX2
// (`CpuOptions::isa`, STSA_ISA) runs no AVX-512 instruction around it either. Every
// path gives the same bits. Whether a helper capped at `cap` may use `isa`:
bool may_use(Isa cap, Isa isa);

// Reads row (b, n, h, :) of t as head_dim floats, each multiplied by `scale`, then zeros to kernel_dim.
void load_row(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, float scale, float* out,
              std::int64_t kernel_dim = 0, Isa cap = Isa::Amx);

// load_row for fp32, fp16 or bf16 rows with contiguous channels, in AVX-512 registers
// (pack_avx512.cpp; only where the CPU has AVX-512), the same values: false, and
// nothing written, for other rows.
bool load_row_avx512(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, float scale, float* out,
                     std::int64_t kernel_dim);

// Reads row (b, n, h, :) of a bf16 tensor as bf16 pairs (bf16_pair), negated when
// `negate`: its own bits, with no rounding; of an fp8 one, likewise from its
// values' bf16 bits (exact). Zeros after them to kernel_dim values (an odd head
// dim's last pair: to head_dim + 1 at least).
void load_row_pairs(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, bool negate,
                    std::uint32_t* out, std::int64_t kernel_dim = 0);

// Starts loading row (b, n, h, :) of t into the cache (for writing: `for_write`);
// nothing past the last token, nor for rows whose channels are not contiguous.
// The rows of one head are a whole [H, D] row apart in the usual [B, N, H, D]
// layout, too far apart for the hardware prefetchers, so a row read without this
// waits for memory; callers ask a few rows ahead.
// Inline: callers ask once per row, in their loops.
inline void prefetch_row(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, bool for_write = false) {
  if (n >= t.tokens() || t.stride[3] != 1) return;
  const std::int64_t bytes = t.head_dim() * std::int64_t(element_size(t.dtype));
  const char* row = static_cast<const char*>(t.data) + t.offset(b, n, h, 0) * std::int64_t(element_size(t.dtype));
  for (std::int64_t at = 0; at < bytes; at += 64) {
    if (for_write)
      __builtin_prefetch(row + at, 1);
    else
      __builtin_prefetch(row + at, 0);
  }
}
inline constexpr int kPrefetchRowsAhead = 4;

// Two values read from a bf16 tensor as one uint32 of their bf16 bits: `low` in
// bits 0-15, `high` in 16-31 (the operand order of VDPBF16PS and TDPBF16PS). Their
// upper halves, since the rest is zero: no rounding, and a loop of these vectorises.
inline std::uint32_t bf16_pair(float low, float high) {
  std::uint32_t l, h;
  std::memcpy(&l, &low, 4);
  std::memcpy(&h, &high, 4);
  return (l >> 16) | (h & 0xffff0000u);
}

// Where a call's rows come from: row n of the call's head h is token tokens[n]
// (n when null) of head heads[h] (h when null) of q, k and v: a gathered input
// (GatheredInput) reads routed attention's temporal heads in place.
struct RowSource {
  TensorView q, k, v;
  const std::int64_t* heads = nullptr;
  const std::int64_t* tokens = nullptr;
  Isa vector_cap = Isa::Amx;  // the helpers' instructions at most (may_use); Amx: whatever the CPU has

  // The tensor head the call's head h reads from q, and from k and v (grouped-query
  // attention: k and v hold fewer heads, each serving q.heads() / k.heads() of q's).
  std::int64_t head(std::int64_t h) const { return heads ? heads[h] : h; }
  std::int64_t kv_head(std::int64_t h) const { return grouped_kv_head(head(h), q, k); }
  std::int64_t token(std::int64_t n) const { return tokens ? tokens[n] : n; }
};

// Where keys c0 .. c0 + count - 1 of the key tile that starts at token n0 have
// their K and V rows (elements of type T; null from `valid` on), prefetching the
// rows `count` keys further on: the vector packers' walk over a tile.
template <typename T>
inline void key_rows(const RowSource& in, std::int64_t b, std::int64_t head, std::int64_t n0, std::int64_t c0,
                     std::int64_t valid, int count, const T** k_rows, const T** v_rows) {
  for (int i = 0; i < count; ++i) {
    const std::int64_t c = c0 + i;
    if (c + count < valid) {
      prefetch_row(in.k, b, in.token(n0 + c + count), head);
      prefetch_row(in.v, b, in.token(n0 + c + count), head);
    }
    if (c >= valid) {
      k_rows[i] = v_rows[i] = nullptr;
      continue;
    }
    const std::int64_t n = in.token(n0 + c);
    k_rows[i] = static_cast<const T*>(in.k.data) + in.k.offset(b, n, head, 0);
    v_rows[i] = static_cast<const T*>(in.v.data) + in.v.offset(b, n, head, 0);
  }
}

// Packs key tile `tile` of the call's (b, h) from `in`: K transposed into kt [head_dim][tile_k] (or,
// when kt_pairs is given, as bf16 pairs of channels into kt_pairs
// [head_dim / 2][tile_k]; kt is then unused and may be null) and V into v_rows
// [tile_k][head_dim], and when v_pairs is given (bf16 or fp16 V) as bf16 pairs
// of consecutive keys into v_pairs [tile_k / 2][head_dim], with v_rows then
// optional (null: not written; unpack_v_pairs makes it where it is needed); all
// zero past the sequence end. fp16 K and V given pairs (the AMX kernel's) are
// split into bf16 high and low parts (split_f16_to_bf16), each pair panel then
// holding the high parts' panel followed by the low parts' (kernel.hpp: KvPanels).
// Returns what the kernels must know about the packed K and V (KvFlags).
struct KvFlags {
  bool nonfinite = false;    // some V value is Inf or NaN
  bool tiny = false;         // some nonzero |V| is below kTinyV
  bool k_nonfinite = false;  // split fp16 K only: some K value is Inf or NaN
};
// Far below any V a model makes, and far above where a product with a part of a P
// that matters (>= 2^-60) would fall under the 2^-126 that bf16 tile products flush.
// (No fp16 value, nor the low part of one, is this small: fp16 goes down to 2^-24.)
inline constexpr float kTinyV = 0x1p-64f;

// bf16 products below 2^-126 flush to zero in VDPBF16PS and the tile unit (bf16 subnormal
// inputs count as zero there too). With at most kMaxHeadDim = 2^10 channels a score loses
// under 2^-116 that way, which times a score scale below this stays under 2^-24 in exp2's
// argument: a bf16 head with a larger scale computes Q K^T from fp32 (head_takes_bf16_products).
inline constexpr double kBf16PairScoreScaleLimit = 0x1p91;
// With kernel_dim above the head dim, every panel has kernel_dim channels, zero past the head's.
KvFlags pack_kv_tile(const RowSource& in, std::int64_t b, std::int64_t h, std::int64_t tile, int tile_k, float* kt,
                     float* v_rows, std::uint32_t* kt_pairs = nullptr, std::uint32_t* v_pairs = nullptr,
                     std::int64_t kernel_dim = 0);
// pack_kv_tile's work for bf16 or fp16 K and V (both the same) into pair panels
// only (kt and v_rows not written), with AVX-512 (pack_pairs_amx.cpp; only for
// CPUs with AVX-512), padded to kernel_dim channels as pack_kv_tile pads: false,
// and nothing written, where it does not apply (another dtype, channels not
// contiguous, a kernel dim (the head dim, if larger) not a multiple of 32 or above
// kMaxPairPanelDim, tile_k not a multiple of 16). Ors the flags into `flags`.
bool pack_pairs_tile_amx(const RowSource& in, std::int64_t b, std::int64_t h, std::int64_t tile, int tile_k,
                         std::uint32_t* kt_pairs, std::uint32_t* v_pairs, KvFlags& flags,
                         std::int64_t kernel_dim = 0);
// Whether the vector packers and loaders widen `dtype` to fp32 in registers (exactly).
inline bool widens_to_float(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16;
}

// What a fp32-panel packer that takes `keys` keys, and channels, at a time packs of key
// tile `tile` of head h: its head in the tensors, first token, valid keys and the panels'
// channels (the head's, then zeros to the kernel dim). None for what it cannot take: fp8,
// K and V of two dtypes, channels not contiguous, a kernel dim or tile_k not a multiple of `keys`.
struct FloatTile {
  std::int64_t head, n0, valid;
  int kd;
};
inline std::optional<FloatTile> float_tile(const RowSource& in, std::int64_t h, std::int64_t tile, int tile_k,
                                           std::int64_t kernel_dim, int keys) {
  const TensorView &k = in.k, &v = in.v;
  const int kd = int(std::max<std::int64_t>(kernel_dim, k.head_dim()));
  if (!widens_to_float(k.dtype) || v.dtype != k.dtype || k.stride[3] != 1 || v.stride[3] != 1 || kd % keys != 0 ||
      tile_k % keys != 0)
    return std::nullopt;
  const std::int64_t n0 = tile * tile_k;
  return FloatTile{in.kv_head(h), n0, std::min<std::int64_t>(tile_k, k.tokens() - n0), kd};
}

// Which packer pack_kv_tile gives fp32 panels of inputs the vector packers take, capped at `cap`.
enum class FloatPacker { Avx512, Avx2, Elementwise };
FloatPacker float_packer(Isa cap);

// The same for fp32, fp16 or bf16 K and V (one dtype) into kt and v_rows as fp32
// (pack_avx512.cpp), padded to kernel_dim channels likewise: false, and nothing
// written, for fp8, K and V of two dtypes, channels not contiguous, a kernel dim
// (the head dim, if larger) or tile_k not a multiple of 16.
bool pack_floats_tile_avx512(const RowSource& in, std::int64_t b, std::int64_t h, std::int64_t tile, int tile_k,
                             float* kt, float* v_rows, KvFlags& flags, std::int64_t kernel_dim = 0);
// The same on AVX2 hosts (pack_avx2.cpp; only where the CPU has AVX2), 8 keys at a time:
// false, and nothing written, for the same inputs but with 8 in place of 16.
bool pack_floats_tile_avx2(const RowSource& in, std::int64_t b, std::int64_t h, std::int64_t tile, int tile_k,
                           float* kt, float* v_rows, KvFlags& flags, std::int64_t kernel_dim = 0);
// v_rows [tile_k][head_dim] from the v_pairs pack_kv_tile wrote, with `parts` 1
// (bf16 V) or 2 (split fp16 V, summed): exact, as each value is in fp32.
void unpack_v_pairs(const std::uint32_t* v_pairs, int tile_k, std::int64_t head_dim, int parts, float* v_rows);

// Reads row (b, n, h, :) of an fp16 tensor as bf16 pairs of its high parts, then
// those of its low parts (split_f16_to_bf16; head_dim words in all, each part
// padded with zeros to kernel_dim values, an odd head dim's to head_dim + 1),
// negated when `negate`. Returns whether the row holds an Inf or NaN.
bool load_row_split_pairs(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, bool negate,
                          std::uint32_t* out, std::int64_t kernel_dim = 0);

// Where finished rows go: row n of the call's head h lands at token tokens[n]
// (n when null) of head heads[h] (h when null) of o and lse: a scattered
// output (ScatteredOutput) stores routed attention's temporal heads in place.
struct RowDestination {
  TensorView o;
  LseView lse;  // data == nullptr: no LSE
  const std::int64_t* heads = nullptr;
  const std::int64_t* tokens = nullptr;
  Isa vector_cap = Isa::Amx;  // as RowSource's
};

// Writes finished rows n0 .. n0 + rows - 1 of (b, h) where `out` says:
// O = acc[i] / l[i] * out_scale (V's descale) and LSE = m[i] * score_scale + ln l[i],
// from the kernel's running max m of the unscaled scores and sum l. A row with
// l == 0 (nothing allowed) gets O = 0 and LSE = -inf. acc's rows are acc_stride
// floats apart (0 or less: the head dim), of which the first head_dim are O's.
void store_rows(const RowDestination& out, std::int64_t b, std::int64_t h, std::int64_t n0, int rows,
                const float* acc, const float* m, const float* l, double score_scale, float out_scale = 1.0f,
                std::int64_t acc_stride = 0);

// dst[d] = a[d] / l * scale for `count` channels of `dtype` (each step rounded to
// fp32): fp32, or rounded to bf16 or fp16 as float_to_bf16 and float_to_f16 do
// (store_avx512.cpp; only for CPUs with AVX-512).
void divide_row_avx512(const float* a, float l, float scale, std::int64_t count, DType dtype, void* dst);

// count contiguous fp8 (E4M3FN) values as their bf16 bits, each as f8e4m3_to_bf16
// gives it (convert_f8_avx512.cpp; only where the CPU has AVX-512).
void f8e4m3_to_bf16_avx512(const std::uint8_t* src, std::int64_t count, std::uint16_t* dst);

}  // namespace stsa::cpu
