// The router's sampled attention as products of bf16 pairs: the scores of a
// few sampled query rows against a block of keys, and the weighted sums of V
// for many weight rows at once, on AMX tiles (routing_tiles_amx.cpp, built with
// the AMX flags; call only where machine_supports(Isa::Amx)); and the scores
// alone with AVX-512 VDPBF16PS (routing_dot_avx512.cpp; call only where
// machine_supports(Isa::Avx512)). Plain pointers only, for the reason
// kernel.hpp gives.
//
// Operands are bf16 pairs as pack.hpp lays them out: Q rows from
// load_row_pairs / load_row_split_pairs; K and V as pack_kv_tile packs tiles of
// kRoutingPanelKeys keys, the tiles' panels one after another (tile t's K panel,
// [parts][head_dim / 2][32], at kt + t * parts * head_dim * 16; its V panel,
// [parts][16][head_dim], at v + t * parts * 16 * head_dim). `parts` is 1 for
// bf16 values and 2 for fp16 values split into a high and a low bf16 part
// (split_f16_to_bf16), a panel of split values holding the high parts' panel
// and then the low parts'.
#pragma once

#include <cstdint>

namespace stsa::cpu {

inline constexpr int kRoutingPanelKeys = 32;
// Head dims the tile products take: multiples of this (one product's depth, 16 pairs).
inline constexpr int kRoutingDimStep = 32;

// s[r][j] = sum_d q[r][d] k[j][d] (unscaled) for `rows` query rows (a multiple
// of 16) and `keys` keys (a multiple of 32): q holds parts * head_dim / 2 words
// per row (part a at a * head_dim / 2), s has row stride s_stride floats.
// Split values take all four products of their parts, so S is what fp32 FMAs
// on the values give, up to the order of the sums. head_dim: a multiple of kRoutingDimStep.
void routing_scores_amx(const std::uint32_t* q, const std::uint32_t* kt, int rows, int keys, int head_dim, int parts,
                        float* s, int s_stride);

// acc[i][d] += sum_j w[i][j] v[j][d] for `rows` weight rows (a multiple of 16)
// over `keys` keys (a multiple of 32). w: w_parts bf16 parts of each weight
// (1 or 2, part p's rows at w + p * w_part_stride, row stride w_stride); v:
// v_parts parts; acc: row stride acc_stride floats. Products of a weight part
// p and a V part b with p + b >= max(w_parts, v_parts) are left out (below
// 2^-16 of their term, as split_weights leaves out). live[t * live_stride + c
// / 32]: whether rows 16t .. 16t + 15 have a nonzero weight among keys c .. c +
// 31; the products of those that have none are skipped (their weights need
// not even be written). head_dim: a multiple of kRoutingDimStep.
void routing_weighted_sums_amx(const std::uint16_t* w, std::int64_t w_part_stride, int w_parts, int w_stride,
                               const std::uint32_t* v, int v_parts, int rows, int keys, int head_dim,
                               const std::uint8_t* live, int live_stride, float* acc, int acc_stride);

// routing_scores_amx for bf16 values only (parts 1), with AVX-512 VDPBF16PS
// (routing_dot_avx512.cpp): the same exact products, summed in fp32 in another
// order; rows a multiple of 8, keys a multiple of 32.
void routing_scores_avx512(const std::uint32_t* q, const std::uint32_t* kt, int rows, int keys, int head_dim,
                           float* s, int s_stride);

// Two bf16 parts of each weight of w[rows][cols] (row stride `stride`, cols a
// multiple of 32), the attention kernel's split of P into two parts
// (split_parts_avx512.hpp): part p of row i at parts + p * part_stride + i *
// stride, the high part w with its low 16 bits dropped, the low part the
// remainder rounded to nearest; their sum is within 2^-16 of w.
void split_weights_amx(const float* w, int rows, int cols, int stride, std::int64_t part_stride,
                       std::uint16_t* parts);

}  // namespace stsa::cpu
