#include "cli/options.hpp"

#include <CLI/CLI.hpp>

#include "stsa/error.hpp"
#include "stsa/policy.hpp"

namespace stsa::cli {

VideoGrid GridArgs::grid() const {
  VideoGrid g;
  g.frames = frames;
  g.height = height;
  g.width = width;
  g.text_tokens = text;
  STSA_CHECK(text_placement == "before" || text_placement == "after", InvalidArgument,
             "--text-placement must be before or after, got '", text_placement, "'");
  g.text_placement = text_placement == "before" ? TextPlacement::Before : TextPlacement::After;
  g.validate();
  return g;
}

void add_grid_options(CLI::App* command, GridArgs& args) {
  command->add_option("--frames", args.frames, "latent frames F (>= 1)")->capture_default_str();
  command->add_option("--height", args.height, "tokens per frame, vertically (>= 1)")->capture_default_str();
  command->add_option("--width", args.width, "tokens per frame, horizontally (>= 1)")->capture_default_str();
  command->add_option("--text", args.text, "text tokens in joint self-attention (>= 0)")->capture_default_str();
  command->add_option("--text-placement", args.text_placement, "text tokens before or after the video")
      ->capture_default_str();
  std::string names;
  for (const ModelPreset& p : model_presets()) names += (names.empty() ? "" : ", ") + p.name;
  command->add_option("--preset", args.preset,
                      "a model's shape (grid, heads, head dim): " + names + "; the shape options given override it");
}

void apply_preset(const CLI::App& command, GridArgs& grid, std::int64_t* heads, std::int64_t* head_dim) {
  if (command.count("--preset") == 0) return;
  const ModelPreset& preset = model_preset(grid.preset);  // "" too: not a preset
  const auto unless_given = [&](const char* flag, auto& field, auto value) {
    if (command.count(flag) == 0) field = value;
  };
  unless_given("--frames", grid.frames, preset.grid.frames);
  unless_given("--height", grid.height, preset.grid.height);
  unless_given("--width", grid.width, preset.grid.width);
  unless_given("--text", grid.text, preset.grid.text_tokens);
  unless_given("--text-placement", grid.text_placement,
               std::string(preset.grid.text_placement == TextPlacement::Before ? "before" : "after"));
  if (heads != nullptr) unless_given("--heads", *heads, preset.heads);
  if (head_dim != nullptr) unless_given("--head-dim", *head_dim, preset.head_dim);
}

MaskSpec mask_by_name(const VideoGrid& grid, const std::string& name, double density, bool anchor) {
  if (name == "dense") return MaskSpec::dense();
  if (name == "spatial") return mask_for_density(grid, SparseKind::Spatial, density, anchor);
  if (name == "temporal") return mask_for_density(grid, SparseKind::Temporal, density, anchor);
  if (name == "frames") return mask_for_density(grid, SparseKind::FrameWindow, density, anchor);
  throw InvalidArgument(detail::concat("--mask must be dense, spatial, temporal or frames, got '", name, "'"));
}

}  // namespace stsa::cli
