// Options shared by several commands: the token grid and the mask by name.
#pragma once

#include <string>
#include <vector>

#include "stsa/layout.hpp"
#include "stsa/mask.hpp"

namespace CLI {
class App;  // <CLI/CLI.hpp> only where options are registered (commands.hpp says why)
}  // namespace CLI

namespace stsa::cli {

struct GridArgs {
  std::int64_t frames = 21, height = 45, width = 80, text = 0;
  std::string text_placement = "after";
  VideoGrid grid() const;  // validated
};

// --frames --height --width --text --text-placement
void add_grid_options(CLI::App* command, GridArgs& args);

// "dense" | "spatial" | "temporal" | "frames" at kept density `density`.
MaskSpec mask_by_name(const VideoGrid& grid, const std::string& name, double density, bool anchor = true);
inline const std::vector<std::string> kMaskNames{"dense", "spatial", "temporal", "frames"};

}  // namespace stsa::cli
