// The AMX tile configuration every *_amx.cpp file uses, and the moves of its
// accumulators. Included inside an anonymous namespace, after <immintrin.h>, by
// files built with the AMX flags (see kernel.hpp for why).

// The 64-byte operand of LDTILECFG (palette 1).
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};

// Every tile 16 rows x 64 bytes. Tiles 0-3: fp32 accumulators, 2 x 2 blocks of
// 16 x 16; 4-5: left operands (16 rows x 32 bf16); 6-7: right operands (16 rows
// of bf16 pairs x 16 columns).
TileConfig square_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = 16;
  }
  return config;
}

// The accumulator tiles of a block, 0 and 1 side by side (16 rows x 32 columns),
// 2 and 3 below them, to or from fp32 rows at `at`, `row_floats` apart.
template <int kRowTiles>
void store_accumulators(float* at, long row_floats) {
  const long bytes = row_floats * 4;
  _tile_stored(0, at, bytes);
  _tile_stored(1, at + 16, bytes);
  if constexpr (kRowTiles == 2) {
    _tile_stored(2, at + 16 * row_floats, bytes);
    _tile_stored(3, at + 16 * row_floats + 16, bytes);
  }
}

template <int kRowTiles>
void load_accumulators(const float* at, long row_floats) {
  const long bytes = row_floats * 4;
  _tile_loadd(0, at, bytes);
  _tile_loadd(1, at + 16, bytes);
  if constexpr (kRowTiles == 2) {
    _tile_loadd(2, at + 16 * row_floats, bytes);
    _tile_loadd(3, at + 16 * row_floats + 16, bytes);
  }
}
