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
  std::string preset;      // --preset: a model's shape (stsa::model_presets())
  VideoGrid grid() const;  // validated
};

// --frames --height --width --text --text-placement --preset
void add_grid_options(CLI::App* command, GridArgs& args);

// After parsing: --preset's grid (and heads and head dim, where the command has them) in
// every shape option the command line did not give. An unknown name: InvalidArgument
// listing the presets.
void apply_preset(const CLI::App& command, GridArgs& grid, std::int64_t* heads = nullptr,
                  std::int64_t* head_dim = nullptr);

// "dense" | "spatial" | "temporal" | "frames" at kept density `density`.
MaskSpec mask_by_name(const VideoGrid& grid, const std::string& name, double density, bool anchor = true);
inline const std::vector<std::string> kMaskNames{"dense", "spatial", "temporal", "frames"};

}  // namespace stsa::cli
