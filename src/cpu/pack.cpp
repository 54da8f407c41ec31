#include "cpu/pack.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace stsa::cpu {

void load_row(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, float scale, float* out) {
  const std::int64_t d_count = t.head_dim();
  const std::int64_t base = t.offset(b, n, h, 0);
  const std::int64_t step = t.stride[3];
  switch (t.dtype) {
    case DType::F32: {
      const float* src = static_cast<const float*>(t.data) + base;
      if (step == 1) {  // the usual case; a unit stride lets the compiler vectorise
        for (std::int64_t d = 0; d < d_count; ++d) out[d] = src[d] * scale;
      } else {
        for (std::int64_t d = 0; d < d_count; ++d) out[d] = src[d * step] * scale;
      }
      return;
    }
    case DType::BF16: {
      const std::uint16_t* src = static_cast<const std::uint16_t*>(t.data) + base;
      if (step == 1) {
        for (std::int64_t d = 0; d < d_count; ++d) out[d] = bf16_to_float(src[d]) * scale;
      } else {
        for (std::int64_t d = 0; d < d_count; ++d) out[d] = bf16_to_float(src[d * step]) * scale;
      }
      return;
    }
    case DType::F16: {
      const std::uint16_t* src = static_cast<const std::uint16_t*>(t.data) + base;
      for (std::int64_t d = 0; d < d_count; ++d) out[d] = f16_to_float(src[d * step]) * scale;
      return;
    }
  }
}

void load_row_pairs(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, bool negate,
                    std::uint32_t* out) {
  const std::uint16_t* src = static_cast<const std::uint16_t*>(t.data) + t.offset(b, n, h, 0);
  const std::int64_t step = t.stride[3];
  const std::uint32_t sign = negate ? 0x80008000u : 0u;  // flips both halves' sign bits: exact, NaN stays NaN
  for (std::int64_t i = 0; i < t.head_dim() / 2; ++i)
    out[i] = (std::uint32_t(src[2 * i * step]) | (std::uint32_t(src[(2 * i + 1) * step]) << 16)) ^ sign;
}

void prefetch_row(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, bool for_write) {
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

PackedV pack_kv_tile(const RowSource& in, std::int64_t b, std::int64_t h, std::int64_t tile, int tile_k, float* kt,
                     float* v_rows, std::uint32_t* kt_pairs, std::uint32_t* v_pairs) {
  const TensorView &k = in.k, &v = in.v;
  const std::int64_t head = in.head(h);
  const std::int64_t d_count = k.head_dim();
  const std::int64_t n0 = tile * tile_k;
  const std::int64_t valid = std::min<std::int64_t>(tile_k, k.tokens() - n0);
  float row[1024];  // head dims the kernels support are far below this
  PackedV flags;
  for (std::int64_t c = 0; c < valid; ++c) {
    if (c + kPrefetchRowsAhead < valid) {
      prefetch_row(k, b, in.token(n0 + c + kPrefetchRowsAhead), head);
      prefetch_row(v, b, in.token(n0 + c + kPrefetchRowsAhead), head);
    }
    const std::int64_t n = in.token(n0 + c);
    load_row(k, b, n, head, 1.0f, row);
    if (kt_pairs != nullptr) {
      for (std::int64_t i = 0; i < d_count / 2; ++i) kt_pairs[i * tile_k + c] = bf16_pair(row[2 * i], row[2 * i + 1]);
    } else {
      for (std::int64_t d = 0; d < d_count; ++d) kt[d * tile_k + c] = row[d];
    }
    float* vr = v_rows + c * d_count;
    load_row(v, b, n, head, 1.0f, vr);
    for (std::int64_t d = 0; d < d_count; ++d) {
      const float a = std::fabs(vr[d]);
      flags.nonfinite |= !(a <= std::numeric_limits<float>::max());
      flags.tiny |= a != 0.0f && a < kTinyV;
    }
  }
  if (kt_pairs != nullptr) {
    for (std::int64_t i = 0; i < d_count / 2; ++i)
      for (std::int64_t c = valid; c < tile_k; ++c) kt_pairs[i * tile_k + c] = 0;
  } else {
    for (std::int64_t d = 0; d < d_count; ++d)
      for (std::int64_t c = valid; c < tile_k; ++c) kt[d * tile_k + c] = 0.0f;
  }
  if (valid < tile_k) std::memset(v_rows + valid * d_count, 0, std::size_t((tile_k - valid) * d_count) * sizeof(float));
  if (v_pairs != nullptr)
    for (std::int64_t c2 = 0; c2 < tile_k / 2; ++c2)
      for (std::int64_t d = 0; d < d_count; ++d)
        v_pairs[c2 * d_count + d] = bf16_pair(v_rows[2 * c2 * d_count + d], v_rows[(2 * c2 + 1) * d_count + d]);
  return flags;
}

void store_rows(const RowDestination& out, std::int64_t b, std::int64_t h, std::int64_t n0, int rows,
                const float* acc, const float* m, const float* l, double score_scale) {
  const TensorView& o = out.o;
  const std::int64_t head = out.heads ? out.heads[h] : h;
  const auto token = [&](int i) { return out.tokens ? out.tokens[n0 + i] : n0 + i; };
  const std::int64_t d_count = o.head_dim();
  for (int i = 0; i < rows; ++i) {
    if (i + kPrefetchRowsAhead < rows) prefetch_row(o, b, token(i + kPrefetchRowsAhead), head, /*for_write=*/true);
    const float* a = acc + i * d_count;
    const bool empty = l[i] == 0.0f;
    const std::int64_t n = token(i);
    const std::int64_t base = o.offset(b, n, head, 0);
    const std::int64_t step = o.stride[3];
    if (o.dtype == DType::F32) {
      float* dst = static_cast<float*>(o.data) + base;
      for (std::int64_t d = 0; d < d_count; ++d) dst[d * step] = empty ? 0.0f : a[d] / l[i];
    } else {
      for (std::int64_t d = 0; d < d_count; ++d)
        store_from_float(o.data, o.dtype, base + d * step, empty ? 0.0f : a[d] / l[i]);
    }
    if (out.lse.data != nullptr)
      out.lse.at(b, head, n) =
          empty ? -std::numeric_limits<float>::infinity() : float(double(m[i]) * score_scale + std::log(double(l[i])));
  }
}

}  // namespace stsa::cpu
