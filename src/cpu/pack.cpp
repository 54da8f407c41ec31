#include "cpu/pack.hpp"

#include "cpu/isa.hpp"
#include "cpu/kernel.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace stsa::cpu {

namespace {

// The row's values times scale, one converted element at a time; a unit stride
// (the usual case) gets a loop of its own, which the compiler vectorises.
template <typename T, typename Convert>
void convert_row(const void* data, std::int64_t base, std::int64_t step, std::int64_t count, float scale, float* out,
                 Convert convert) {
  const T* src = static_cast<const T*>(data) + base;
  if (step == 1) {
    for (std::int64_t d = 0; d < count; ++d) out[d] = convert(src[d]) * scale;
  } else {
    for (std::int64_t d = 0; d < count; ++d) out[d] = convert(src[d * step]) * scale;
  }
}

// Flips the sign bits of `count` bf16 values: exact, NaN stays NaN (padding after them keeps +0).
void negate_bf16(std::uint16_t* values, std::int64_t count) {
  for (std::int64_t d = 0; d < count; ++d) values[d] ^= 0x8000u;
}

}  // namespace

bool may_use(Isa cap, Isa isa) { return (cap == Isa::Auto || cap >= isa) && machine_supports(isa); }

FloatPacker float_packer(Isa cap) {
  if (may_use(cap, Isa::Avx512)) return FloatPacker::Avx512;
  return may_use(cap, Isa::Avx2) ? FloatPacker::Avx2 : FloatPacker::Elementwise;
}

void load_row(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, float scale, float* out,
              std::int64_t kernel_dim, Isa cap) {
  if (may_use(cap, Isa::Avx512) && load_row_avx512(t, b, n, h, scale, out, kernel_dim)) return;
  const std::int64_t d_count = t.head_dim(), base = t.offset(b, n, h, 0), step = t.stride[3];
  switch (t.dtype) {
    case DType::F32:
      convert_row<float>(t.data, base, step, d_count, scale, out, [](float x) { return x; });
      break;
    case DType::BF16:
      convert_row<std::uint16_t>(t.data, base, step, d_count, scale, out, bf16_to_float);
      break;
    case DType::F16:
      convert_row<std::uint16_t>(t.data, base, step, d_count, scale, out, f16_to_float);
      break;
    case DType::F8E4M3:
      convert_row<std::uint8_t>(t.data, base, step, d_count, scale, out, f8e4m3_to_float);
      break;
  }
  std::fill(out + d_count, out + std::max(kernel_dim, d_count), 0.0f);
}

namespace {

// Row (b, n, h, :) of an fp8 tensor as its values' bf16 bits (for pair panels alone,
// which only calls on AVX-512 or AMX ask for: no cap to keep to).
void load_row_f8_as_bf16(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, std::uint16_t* out) {
  const std::uint8_t* src = static_cast<const std::uint8_t*>(t.data) + t.offset(b, n, h, 0);
  const std::int64_t step = t.stride[3];
  static const bool avx512 = machine_supports(Isa::Avx512);
  if (step == 1 && avx512) {
    f8e4m3_to_bf16_avx512(src, t.head_dim(), out);
  } else if (step == 1) {
    for (std::int64_t d = 0; d < t.head_dim(); ++d) out[d] = f8e4m3_to_bf16(src[d]);
  } else {
    for (std::int64_t d = 0; d < t.head_dim(); ++d) out[d] = f8e4m3_to_bf16(src[d * step]);
  }
}

}  // namespace

void load_row_pairs(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, bool negate,
                    std::uint32_t* out, std::int64_t kernel_dim) {
  const std::int64_t d_count = t.head_dim();
  // A row of pairs is its bf16 values in order, then zeros to kernel_dim (an odd
  // head dim's last pair included).
  std::uint16_t* values = reinterpret_cast<std::uint16_t*>(out);
  if (t.dtype == DType::F8E4M3) {
    load_row_f8_as_bf16(t, b, n, h, values);
  } else {
    const std::uint16_t* src = static_cast<const std::uint16_t*>(t.data) + t.offset(b, n, h, 0);
    const std::int64_t step = t.stride[3];
    if (step == 1) {
      std::memcpy(values, src, std::size_t(d_count) * 2);
    } else {
      for (std::int64_t d = 0; d < d_count; ++d) values[d] = src[d * step];
    }
  }
  const std::int64_t padded = std::max(kernel_dim, d_count + d_count % 2);
  std::fill(values + d_count, values + padded, std::uint16_t(0));
  if (negate) negate_bf16(values, d_count);
}

namespace {

// Row (b, n, h, :) of a 16-bit tensor as its bits.
void load_row_bits(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, std::uint16_t* out) {
  const std::uint16_t* src = static_cast<const std::uint16_t*>(t.data) + t.offset(b, n, h, 0);
  const std::int64_t step = t.stride[3];
  if (step == 1) {
    std::memcpy(out, src, std::size_t(t.head_dim()) * 2);
    return;
  }
  for (std::int64_t d = 0; d < t.head_dim(); ++d) out[d] = src[d * step];
}

// Row (b, n, h, :) of a bf16 or fp8 tensor as bf16 bits.
void load_row_as_bf16(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, std::uint16_t* out) {
  if (t.dtype == DType::F8E4M3)
    load_row_f8_as_bf16(t, b, n, h, out);
  else
    load_row_bits(t, b, n, h, out);
}

// Row (b, n, h, :) of an fp16 tensor as bf16 high and low parts
// (split_f16_to_bf16), read in place where its channels are contiguous. Returns
// whether the row holds an Inf or NaN.
bool split_row(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, std::uint16_t* high,
               std::uint16_t* low) {
  if (t.stride[3] == 1)
    return split_f16_to_bf16(static_cast<const std::uint16_t*>(t.data) + t.offset(b, n, h, 0), t.head_dim(), high,
                             low);
  std::uint16_t bits[1024];
  load_row_bits(t, b, n, h, bits);
  return split_f16_to_bf16(bits, t.head_dim(), high, low);
}

// KvFlags' V flags of bf16 values from their bits: an all-ones exponent is Inf or
// NaN; magnitudes order as their bits do, so tiny is nonzero below kTinyV's bits.
void flag_bf16(const std::uint16_t* bits, std::int64_t count, KvFlags& flags) {
  constexpr std::uint16_t kExponent = 0x7f80, kTinyBits = 0x1f80;  // 2^-64: exponent 127 - 64, no fraction
  static_assert(0x1p-64f == kTinyV, "kTinyBits spells kTinyV");
  // The largest magnitude and the smallest nonzero one: min/max reductions in int,
  // which vectorise with the baseline instruction set (16-bit ones would not).
  int largest = 0, smallest = 0x7fff;
  for (std::int64_t d = 0; d < count; ++d) {
    const int magnitude = bits[d] & 0x7fff;
    largest = largest > magnitude ? largest : magnitude;
    const int nonzero = magnitude == 0 ? 0x7fff : magnitude;
    smallest = smallest < nonzero ? smallest : nonzero;
  }
  flags.nonfinite |= largest >= kExponent;
  flags.tiny |= smallest < kTinyBits;
}

void flag_floats(const float* values, std::int64_t count, KvFlags& flags) {
  for (std::int64_t d = 0; d < count; ++d) {
    const float a = std::fabs(values[d]);
    flags.nonfinite |= !(a <= std::numeric_limits<float>::max());
    flags.tiny |= a != 0.0f && a < kTinyV;
  }
}

}  // namespace

KvFlags pack_kv_tile(const RowSource& in, std::int64_t b, std::int64_t h, std::int64_t tile, int tile_k, float* kt,
                     float* v_rows, std::uint32_t* kt_pairs, std::uint32_t* v_pairs, std::int64_t kernel_dim) {
  const TensorView &k = in.k, &v = in.v;
  const std::int64_t d_count = k.head_dim();
  // The panels' channels: the head's, then zeros (a head dim the kernels are not built for).
  const std::int64_t kd = std::max(kernel_dim, d_count);
  // The vector packers, where they apply: on AVX-512, pair panels alone (the AMX
  // kernel's and the router's) or fp32 panels alone; on AVX2 alone, fp32 panels
  // alone; padded or not. Each declines what it cannot take.
  const bool floats_alone = kt != nullptr && v_rows != nullptr && kt_pairs == nullptr && v_pairs == nullptr;
  if (floats_alone) {
    KvFlags flags;
    switch (float_packer(in.vector_cap)) {
      case FloatPacker::Avx512:
        if (pack_floats_tile_avx512(in, b, h, tile, tile_k, kt, v_rows, flags, kd)) return flags;
        break;
      case FloatPacker::Avx2:
        if (pack_floats_tile_avx2(in, b, h, tile, tile_k, kt, v_rows, flags, kd)) return flags;
        break;
      case FloatPacker::Elementwise:
        break;
    }
  }
  if (kt == nullptr && v_rows == nullptr && kt_pairs != nullptr && v_pairs != nullptr &&
      may_use(in.vector_cap, Isa::Avx512)) {
    KvFlags flags;
    if (pack_pairs_tile_amx(in, b, h, tile, tile_k, kt_pairs, v_pairs, flags, kd)) return flags;
  }
  const std::int64_t head = in.kv_head(h);
  const std::int64_t n0 = tile * tile_k;
  const std::int64_t valid = std::min<std::int64_t>(tile_k, k.tokens() - n0);
  // bf16 K and V move as bits: K's pairs are its rows' own words, V's pairs two
  // keys' values side by side; nothing goes through fp32 on the way. fp16 ones
  // given pairs move as the bits of their two bf16 parts, fp8 ones as their bf16 bits.
  const bool k_split = kt_pairs != nullptr && k.dtype == DType::F16;
  const bool k_bits = kt_pairs != nullptr && (k.dtype == DType::BF16 || k.dtype == DType::F8E4M3);
  const bool v_split = v_pairs != nullptr && v.dtype == DType::F16;
  const bool v_bits = v.dtype == DType::BF16 || (v_pairs != nullptr && v.dtype == DType::F8E4M3) || v_split;
  const int parts = v_split ? 2 : 1;
  const std::int64_t k_part = kd / 2 * tile_k, v_part = std::int64_t(tile_k) / 2 * kd;
  float row[1024];  // head dims the kernels support are far below this
  std::uint32_t k_words[1024];  // a K row's pairs (split fp16: its high parts' pairs, then its low parts')
  std::uint16_t v_keys[2][2][1024];  // [part][key of the pair][channel]: the bits of a pair of keys' V rows
  KvFlags flags;
  for (std::int64_t c = 0; c < valid; ++c) {
    if (c + kPrefetchRowsAhead < valid) {
      prefetch_row(k, b, in.token(n0 + c + kPrefetchRowsAhead), head);
      prefetch_row(v, b, in.token(n0 + c + kPrefetchRowsAhead), head);
    }
    const std::int64_t n = in.token(n0 + c);
    if (k_split) {
      flags.k_nonfinite |= load_row_split_pairs(k, b, n, head, /*negate=*/false, k_words, kd);
      for (int part = 0; part < 2; ++part)
        for (std::int64_t i = 0; i < kd / 2; ++i) kt_pairs[part * k_part + i * tile_k + c] = k_words[part * kd / 2 + i];
    } else if (k_bits) {
      load_row_pairs(k, b, n, head, /*negate=*/false, k_words, kd);
      for (std::int64_t i = 0; i < kd / 2; ++i) kt_pairs[i * tile_k + c] = k_words[i];
    } else {
      load_row(k, b, n, head, 1.0f, row, kd, in.vector_cap);
      if (kt_pairs != nullptr) {
        for (std::int64_t i = 0; i < kd / 2; ++i) kt_pairs[i * tile_k + c] = bf16_pair(row[2 * i], row[2 * i + 1]);
      } else {
        for (std::int64_t d = 0; d < kd; ++d) kt[d * tile_k + c] = row[d];
      }
    }
    if (!v_bits) {  // (v_pairs is only asked for with bf16, fp16 or fp8 V)
      float* vr = v_rows + c * kd;
      load_row(v, b, n, head, 1.0f, vr, kd, in.vector_cap);
      flag_floats(vr, d_count, flags);
      continue;
    }
    std::uint16_t* high = v_keys[0][c % 2];
    std::uint16_t* low = v_keys[1][c % 2];
    if (v_split) {
      flags.nonfinite |= split_row(v, b, n, head, high, low);
      std::fill(low + d_count, low + kd, std::uint16_t(0));
    } else {
      load_row_as_bf16(v, b, n, head, high);
      flag_bf16(high, d_count, flags);
    }
    std::fill(high + d_count, high + kd, std::uint16_t(0));
    if (v_rows != nullptr)
      for (std::int64_t d = 0; d < kd; ++d) {
        float value = bf16_to_float(high[d]);
        if (v_split) value += bf16_to_float(low[d]);
        v_rows[c * kd + d] = value;
      }
    if (v_pairs != nullptr && (c % 2 == 1 || c + 1 == valid))
      for (int part = 0; part < parts; ++part) {
        std::uint32_t* pairs = v_pairs + part * v_part + c / 2 * kd;
        const std::uint16_t(&keys)[2][1024] = v_keys[part];
        if (c % 2 == 1) {
          for (std::int64_t d = 0; d < kd; ++d) pairs[d] = keys[0][d] | (std::uint32_t(keys[1][d]) << 16);
        } else {  // the last key of an odd count: its partner is padding
          for (std::int64_t d = 0; d < kd; ++d) pairs[d] = keys[0][d];
        }
      }
  }
  if (kt_pairs != nullptr) {
    for (std::int64_t i = 0; i < (k_split ? 2 : 1) * kd / 2; ++i)
      for (std::int64_t c = valid; c < tile_k; ++c) kt_pairs[i * tile_k + c] = 0;
  } else {
    for (std::int64_t d = 0; d < kd; ++d)
      for (std::int64_t c = valid; c < tile_k; ++c) kt[d * tile_k + c] = 0.0f;
  }
  if (v_rows != nullptr && valid < tile_k)
    std::memset(v_rows + valid * kd, 0, std::size_t((tile_k - valid) * kd) * sizeof(float));
  if (v_pairs != nullptr) {
    const std::int64_t written = (valid + 1) / 2;
    for (int part = 0; part < parts; ++part)
      std::memset(v_pairs + part * v_part + written * kd, 0,
                  std::size_t((tile_k / 2 - written) * kd) * sizeof(std::uint32_t));
  }
  return flags;
}

void unpack_v_pairs(const std::uint32_t* v_pairs, int tile_k, std::int64_t d_count, int parts, float* v_rows) {
  const std::int64_t part_words = std::int64_t(tile_k) / 2 * d_count;
  for (std::int64_t c2 = 0; c2 < tile_k / 2; ++c2)
    for (std::int64_t d = 0; d < d_count; ++d) {
      const std::uint32_t high = v_pairs[c2 * d_count + d];
      float even = bf16_to_float(std::uint16_t(high)), odd = bf16_to_float(std::uint16_t(high >> 16));
      if (parts == 2) {  // the low part is 0 for Inf and NaN, which stay themselves
        const std::uint32_t low = v_pairs[part_words + c2 * d_count + d];
        even += bf16_to_float(std::uint16_t(low));
        odd += bf16_to_float(std::uint16_t(low >> 16));
      }
      v_rows[2 * c2 * d_count + d] = even;
      v_rows[(2 * c2 + 1) * d_count + d] = odd;
    }
}

bool load_row_split_pairs(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, bool negate,
                          std::uint32_t* out, std::int64_t kernel_dim) {
  const std::int64_t d_count = t.head_dim();
  const std::int64_t part = std::max(kernel_dim, d_count + d_count % 2);  // each part's values, zeros after
  // A row of pairs is its bf16 values in order, so the parts go straight into out.
  std::uint16_t* high = reinterpret_cast<std::uint16_t*>(out);
  std::uint16_t* low = high + part;
  const bool nonfinite = split_row(t, b, n, h, high, low);
  std::fill(high + d_count, high + part, std::uint16_t(0));
  std::fill(low + d_count, low + part, std::uint16_t(0));
  if (negate) {  // both parts' sign bits: exact, NaN stays NaN
    negate_bf16(high, d_count);
    negate_bf16(low, d_count);
  }
  return nonfinite;
}

namespace {

// O's row a / l * scale (zeros for an empty row) into dst, `step` elements apart,
// through `convert`; one loop per dtype, so the unit-stride one vectorises. (x * 1
// is x exactly: without descales the bits are those of a / l.)
template <typename T, typename Convert>
void store_row(T* dst, std::int64_t step, std::int64_t count, const float* a, float l, float scale, bool empty,
               Convert convert) {
  if (empty) {
    for (std::int64_t d = 0; d < count; ++d) dst[d * step] = convert(0.0f);
  } else if (step == 1) {
    for (std::int64_t d = 0; d < count; ++d) dst[d] = convert(a[d] / l * scale);
  } else {
    for (std::int64_t d = 0; d < count; ++d) dst[d * step] = convert(a[d] / l * scale);
  }
}

}  // namespace

void store_rows(const RowDestination& out, std::int64_t b, std::int64_t h, std::int64_t n0, int rows,
                const float* acc, const float* m, const float* l, double score_scale, float out_scale,
                std::int64_t acc_stride) {
  const TensorView& o = out.o;
  const std::int64_t head = out.heads ? out.heads[h] : h;
  const auto token = [&](int i) { return out.tokens ? out.tokens[n0 + i] : n0 + i; };
  const std::int64_t d_count = o.head_dim();
  const bool vector_rows = may_use(out.vector_cap, Isa::Avx512) && o.stride[3] == 1;
  for (int i = 0; i < rows; ++i) {
    if (i + kPrefetchRowsAhead < rows) prefetch_row(o, b, token(i + kPrefetchRowsAhead), head, /*for_write=*/true);
    const float* a = acc + i * std::max(acc_stride, d_count);
    const bool empty = l[i] == 0.0f;
    const std::int64_t n = token(i);
    const std::int64_t base = o.offset(b, n, head, 0);
    const std::int64_t step = o.stride[3];
    if (vector_rows && !empty) {
      divide_row_avx512(a, l[i], out_scale, d_count, o.dtype,
                        static_cast<char*>(o.data) + base * std::int64_t(element_size(o.dtype)));
    } else {
      switch (o.dtype) {
        case DType::F32:
          store_row(static_cast<float*>(o.data) + base, step, d_count, a, l[i], out_scale, empty,
                    [](float x) { return x; });
          break;
        case DType::BF16:
          store_row(static_cast<std::uint16_t*>(o.data) + base, step, d_count, a, l[i], out_scale, empty,
                    float_to_bf16);
          break;
        case DType::F16:
          store_row(static_cast<std::uint16_t*>(o.data) + base, step, d_count, a, l[i], out_scale, empty,
                    float_to_f16);
          break;
        case DType::F8E4M3:  // not an output type: validate() refuses an fp8 o
          break;
      }
    }
    if (out.lse.data != nullptr)
      out.lse.at(b, head, n) =
          empty ? -std::numeric_limits<float>::infinity() : float(double(m[i]) * score_scale + std::log(double(l[i])));
  }
}

}  // namespace stsa::cpu
