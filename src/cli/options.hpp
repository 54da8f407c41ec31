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

// The check the text of every integer option passes before CLI11 reads it (main.cpp):
// CLI11 2.1 reads with strtoll / strtoull, which saturate out-of-range text to the
// type's limit and read "010" as octal. Returns "" for a decimal integer in range of
// the 64-bit type (unsigned: >= 0), rewriting `text` as plain decimal; else why not.
// (Narrower int options: CLI11 itself refuses what does not fit.)
std::string check_integer_text(std::string& text, bool is_unsigned);

// "dense" | "spatial" | "temporal" | "frames" at kept density `density`; InvalidArgument for
// a density outside [0, 1] (NaN too) whatever the kind, and for the dense mask without the anchor.
MaskSpec mask_by_name(const VideoGrid& grid, const std::string& name, double density, bool anchor = true);
inline const std::vector<std::string> kMaskNames{"dense", "spatial", "temporal", "frames"};

}  // namespace stsa::cli
