// x rounded up to a multiple of `to` (x >= 0, to > 0): the padded sizes of rows, tiles and head dims.
#pragma once

#include <cstdint>

namespace stsa {

constexpr std::int64_t round_up(std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; }

}  // namespace stsa
