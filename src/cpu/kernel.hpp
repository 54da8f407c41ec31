// The per-instruction-set attention kernel's interface: one query tile of one
// (batch, head) against the key tiles its plan lists, on fp32 panels packed by
// pack.cpp. Plain pointers only, so the *_avx512.cpp / *_avx2.cpp files that
// implement it include no library headers (their inline functions would
// otherwise be compiled with instructions other CPUs lack and could be picked
// by the linker for everyone).
#pragma once

#include <cstdint>

namespace stsa::cpu {

// K and V of one (batch, head), packed once and shared by all its query tiles.
struct KvPanels {
  const float* kt = nullptr;   // per key tile t: [head_dim][tile_k] (K transposed), at kt + t * head_dim * tile_k
  // With QueryTileJob::q_pairs: K as bf16 pairs instead, per key tile t
  // [head_dim / 2][tile_k] at kt_pairs + t * head_dim / 2 * tile_k (kt unused).
  // With QueryTileJob::input_parts == 2, each key tile holds that twice: its
  // high parts, then its low parts (so tile t starts at t * head_dim * tile_k).
  const std::uint32_t* kt_pairs = nullptr;
  const float* v = nullptr;    // [k_tiles * tile_k][head_dim]; rows past the sequence are zero
  // For attend_amx, and attend_avx512 given QueryTileJob::p_pairs: V as bf16 pairs of
  // consecutive keys (the tile product's right operand), per key tile t
  // [tile_k / 2][head_dim] at v_pairs + t * tile_k / 2 * head_dim;
  // with input_parts == 2, high then low parts, as kt_pairs.
  const std::uint32_t* v_pairs = nullptr;
  bool v_nonfinite = false;    // some V value is Inf/NaN: masked columns must then be skipped, not multiplied by 0
  // Some nonzero |V| is below kTinyV: bf16 products (tile products, VDPBF16PS), which
  // flush results below 2^-126, would lose its share, so attend_amx and attend_avx512
  // take the fp32 P V.
  bool v_tiny = false;
};

struct QueryTileJob {
  const float* q = nullptr;  // [rows][head_dim], negated when the softmax scale is negative; null with q_pairs
  // bf16 inputs on kernels with a bf16 dot product (attend_avx512): Q as bf16
  // pairs [rows][head_dim / 2] (bf16_pair, pack.hpp), used instead of q for S = Q K^T
  // together with kv.kt_pairs. nullptr: the fp32 path.
  const std::uint32_t* q_pairs = nullptr;
  // attend_avx512 with q_pairs and kv.v_pairs, for bf16 or fp8 inputs with a bf16 output:
  // P rounded to nearest bf16 (as attend_amx's one part, and bf16 FlashAttention
  // kernels), here as pairs of keys, kScratchRows * tile_k / 2 words, for O += P V
  // with VDPBF16PS; l still sums P in fp32. Heads with Inf, NaN or tiny V
  // (kv.v_nonfinite, kv.v_tiny) take the fp32 P V from kv.v instead. nullptr: P V in fp32.
  std::uint32_t* p_pairs = nullptr;
  float exp_scale = 0;       // |softmax scale| * log2(e): p = exp2((s - m) * exp_scale)
  int rows = 0;              // valid query rows of this tile (ragged last tile: fewer than tile_q)
  int tile_k = 0;            // key columns per tile (a multiple of 64)
  std::int64_t tokens = 0;   // sequence length N (the last key tile may be ragged)
  KvPanels kv;
  const std::int32_t* full = nullptr;  // full key tiles, in plan order
  int n_full = 0;
  const std::int32_t* partial = nullptr;          // partial key tiles, in plan order
  const std::uint64_t* const* partial_masks = nullptr;  // bitmask of each partial tile (row r at r * mask_words)
  int n_partial = 0;
  int mask_words = 0;        // 64-bit words per mask row (tile_k / 64)
  // Outputs, per row: unnormalised O (sum_j p_j v_j), running max m of the scores and sum l.
  float* o = nullptr;        // [rows][head_dim]
  float* m = nullptr;        // [rows]
  float* l = nullptr;        // [rows]
  float* scratch = nullptr;  // at least kScratchRows * tile_k floats (attend_amx: kAmxScratchRows)
  // attend_amx only: P split into bf16 parts, kAmxPartRows * tile_k values.
  // It also reads q_pairs and writes o for the rows up to the next multiple of
  // kAmxRowPad; the q_pairs rows past `rows` must be zero.
  std::uint16_t* p_parts = nullptr;
  // attend_amx only: how many parts: 3 (P exactly) where the output is fp32;
  // 1 (P rounded to bf16, as bf16 FlashAttention kernels do) for bf16 inputs with
  // a bf16 output; 2 (P within 2^-16 of itself) for the other 16-bit outputs.
  int p_part_count = 3;
  // attend_amx only: 1 for bf16 Q, K and V; 2 for fp16 ones, each value split
  // into bf16 high and low parts that sum to it exactly (split_f16_to_bf16):
  // a q_pairs row is then its high pairs followed by its low ones (head_dim
  // words), and kv's pairs hold both parts.
  int input_parts = 1;
  // attend_amx with input_parts == 2: some Q row of this tile or some K value of
  // this head is Inf or NaN. A zero low part times an infinite high part would
  // make NaN where Q K^T in fp32 has +-Inf, so S is then summed in fp32 from the
  // parts' sums (each value exactly), as the other kernels do.
  bool qk_nonfinite = false;
};

// 2^f for |f| <= 1/2 as the vector kernels' exp2 takes it: a degree-6 polynomial
// fitted for relative error (2e-9; 1.0e-7 evaluated in fp32), highest power first,
// p(0) = 1 exactly.
inline constexpr float kExp2Poly[7] = {1.53533489e-04f, 1.33988704e-03f, 9.61843692e-03f, 5.55033237e-02f,
                                       2.40226477e-01f, 6.93147182e-01f, 1.0f};

// The same for P that is rounded to bf16 next (the bf16-pair P V): degree 4, relative error 2.7e-6
// (2^-18.5; its p(0) is 1 - 8e-7) against the 2^-9 of that rounding; two FMAs fewer per 16 scores.
inline constexpr float kExp2PolyForBf16[5] = {9.56051052e-03f, 5.59170395e-02f, 2.40249813e-01f, 6.93121970e-01f,
                                              9.99999166e-01f};

// Rows of scores the kernels keep at once; scratch must hold this many rows of tile_k.
inline constexpr int kScratchRows = 48;

// attend_amx: query rows are padded to a multiple of this (one tile's rows). It
// takes up to two key tiles per step for a block of 32 rows: its S then takes
// kAmxScratchRows rows of tile_k floats, its P parts (up to three per row)
// kAmxPartRows rows of tile_k bf16.
inline constexpr int kAmxRowPad = 16;
inline constexpr int kAmxKeyTilesPerStep = 2;
inline constexpr int kAmxScratchRows = 32 * kAmxKeyTilesPerStep;
inline constexpr int kAmxPartRows = 3 * 32 * kAmxKeyTilesPerStep;

using AttendFn = void (*)(const QueryTileJob& job);

// Kernels of each instruction set; nullptr for a head dim it has no instance of.
AttendFn attend_scalar(int head_dim);
AttendFn attend_avx2(int head_dim);
AttendFn attend_avx512(int head_dim);
// S = Q K^T and O += P V as AMX tile products from q_pairs, kv.kt_pairs and
// kv.v_pairs (bf16 Q, K, V, fp8 ones as their bf16 values, or fp16 ones in two parts); head
// dims 64, 96 and 128 (the backend pads the others up to 128 to the next of them).
AttendFn attend_amx(int head_dim);

// fp16 values (their bits) as bf16 high and low parts with high + low == value
// exactly: high is the value rounded to nearest bf16, low the remainder (at most
// 3 significant bits, and no smaller than fp16's 2^-24, so exact and normal in
// bf16). Inf and NaN keep their high part and get a low part of 0. Returns whether
// any value was Inf or NaN. Any count: nothing is read or written past it (a head
// dim that is not a multiple of 32 runs padded). Needs AVX-512 BF16 (every AMX
// machine has it).
bool split_f16_to_bf16(const std::uint16_t* f16, std::int64_t count, std::uint16_t* high, std::uint16_t* low);

// 12 independent FMA chains for `iterations` rounds; returns a value that depends on all of them.
float fma_chains_scalar(std::int64_t iterations);
float fma_chains_avx2(std::int64_t iterations);
float fma_chains_avx512(std::int64_t iterations);
// FLOPs one round of the above executes (12 chains x lanes x 2).
int fma_chain_flops_per_iteration_scalar();
int fma_chain_flops_per_iteration_avx2();
int fma_chain_flops_per_iteration_avx512();
// The same for VDPBF16PS (AVX-512 BF16): 12 chains x 16 lanes x 2 products x 2.
float bf16_dot_chains_avx512(std::int64_t iterations);
int bf16_dot_flops_per_iteration_avx512();
// The same for AMX bf16 tile products (TDPBF16PS); the caller has AMX permission.
float tile_product_chains_amx(std::int64_t iterations);
int tile_product_flops_per_iteration_amx();

}  // namespace stsa::cpu
