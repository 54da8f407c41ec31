// The fp32-panel packers' walk over one key tile, shared by pack_avx512.cpp and
// pack_avx2.cpp: V's rows widened, flagged and stored, K's widened and transposed into
// kt [kernel_dim][tile_k], `Lanes::kWidth` keys and channels at a time. Included inside an
// anonymous namespace, after the file's `Lanes` (its vector width's operations):
//   Vector; kWidth; Seen (the flags seen so far, value-initialised to none);
//   load(row, dtype, d0, count): values [d0, d0 + kWidth) of a row of `count` as fp32 bits,
//     zeros past its end and for a null row;
//   see(x, seen): x's Inf / NaN and nonzero magnitudes below kTinyV into seen;
//   store(float*, x); transpose(Vector (&)[kWidth]); report(seen, KvFlags&).

template <typename Lanes, typename T>
void pack_float_tile(const RowSource& in, std::int64_t b, const FloatTile& at, int tile_k, float* kt,
                     float* v_rows, KvFlags& flags) {
  constexpr int kKeys = Lanes::kWidth;
  const int kd = at.kd, d_count = int(in.k.head_dim());
  const DType dtype = in.k.dtype;  // float_tile takes K and V of one dtype only
  typename Lanes::Seen seen{};
  const T* k_rows[kKeys];
  for (std::int64_t c0 = 0; c0 < tile_k; c0 += kKeys) {
    const T* v_in[kKeys];
    key_rows(in, b, at.head, at.n0, c0, at.valid, kKeys, k_rows, v_in);
    for (int i = 0; i < kKeys; ++i) {
      float* out = v_rows + (c0 + i) * kd;
      if (v_in[i] == nullptr) {
        std::memset(out, 0, std::size_t(kd) * sizeof(float));
        continue;
      }
      for (int d0 = 0; d0 < kd; d0 += kKeys) {
        const typename Lanes::Vector x = Lanes::load(v_in[i], dtype, d0, d_count);
        Lanes::see(x, seen);
        Lanes::store(out + d0, x);
      }
    }
    for (int d0 = 0; d0 < kd; d0 += kKeys) {
      typename Lanes::Vector r[kKeys];
      for (int i = 0; i < kKeys; ++i) r[i] = Lanes::load(k_rows[i], dtype, d0, d_count);
      Lanes::transpose(r);
      for (int i = 0; i < kKeys; ++i) Lanes::store(kt + std::int64_t(d0 + i) * tile_k + c0, r[i]);
    }
  }
  Lanes::report(seen, flags);
}

// A packer's entry: false, and nothing written, for what float_tile declines.
template <typename Lanes>
bool pack_floats_tile_with(const RowSource& in, std::int64_t b, std::int64_t h, std::int64_t tile, int tile_k,
                           float* kt, float* v_rows, KvFlags& flags, std::int64_t kernel_dim) {
  const std::optional<FloatTile> at = float_tile(in, h, tile, tile_k, kernel_dim, Lanes::kWidth);
  if (!at) return false;
  if (in.k.dtype == DType::F32)
    pack_float_tile<Lanes, float>(in, b, *at, tile_k, kt, v_rows, flags);
  else
    pack_float_tile<Lanes, std::uint16_t>(in, b, *at, tile_k, kt, v_rows, flags);
  return true;
}
