// The tile-product loop measure_amx_peak_gflops times (built with the flags
// src/cpu/CMakeLists.txt gives *_amx.cpp).
#include <immintrin.h>

#include "cpu/kernel.hpp"

namespace stsa::cpu {
namespace {

#include "cpu/amx_tiles.hpp"

}  // namespace

// Four accumulators, so each product waits on none of the three before it.
float tile_product_chains_amx(std::int64_t iterations) {
  alignas(64) std::uint16_t operand[16 * 32];
  for (std::uint16_t& x : operand) x = 0x3c00;  // bf16 2^-7: sums stay finite for any run
  const TileConfig config = square_tiles();
  _tile_loadconfig(&config);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (std::int64_t it = 0; it < iterations; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}

int tile_product_flops_per_iteration_amx() { return 4 * 16 * 16 * 32 * 2; }

}  // namespace stsa::cpu
