// Options shared by several commands: the token grid and the mask by name.
#pragma once

#include <string>
#include <vector>

#include "stsa/layout.hpp"
#include "stsa/mask.hpp"

namespace stsa::cli {

struct GridArgs {
  std::int64_t frames = 21, height = 45, width = 80, text = 0;
  std::string text_placement = "after";
  std::string preset;      // --preset: a model's shape (stsa::model_presets())
  VideoGrid grid() const;  // validated
};

// "dense" | "spatial" | "temporal" | "frames" at kept density `density`.
MaskSpec mask_by_name(const VideoGrid& grid, const std::string& name, double density, bool anchor = true);
inline const std::vector<std::string> kMaskNames{"dense", "spatial", "temporal", "frames"};

}  // namespace stsa::cli
