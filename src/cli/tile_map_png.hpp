// A picture of a tile plan: one pixel per tile (or per block of tiles when the
// plan is larger than max_side), white empty, blue full, orange partial.
#pragma once

#include <string>

#include "stsa/plan.hpp"

namespace stsa::cli {

// Refuses to overwrite an existing file unless overwrite is true; throws IoError. A failed
// write leaves no partial file (io::files::write_file).
void write_tile_map_png(const TilePlan& plan, const std::string& path, bool overwrite, int max_side = 2048);

}  // namespace stsa::cli
