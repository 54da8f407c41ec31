// Shapes from the models' published configs (see docs/routing.md): tokens after
// the VAE (8x spatial, 4x temporal compression, first frame kept; Wan2.2-TI2V-5B's
// and HunyuanVideo 1.5's VAEs compress 16x spatially (1x1x1 patches in 1.5), LTX's 32x
// spatially and 8x in time with 1x1x1 patches) and 1x2x2 patches. The policies are
// starting points in line with Sparse VideoGen's settings (dense warm-up for about the
// first quarter of the steps and the first layer, kept density 0.25), not values tuned
// on generated videos.
#include <string>

#include "stsa/error.hpp"
#include "stsa/policy.hpp"

namespace stsa {
namespace {

PolicyOptions starting_policy(std::int64_t dense_steps) {
  PolicyOptions p;
  p.dense_steps = dense_steps;
  p.dense_layers = 1;
  p.reuse_steps = 1;
  p.router.spatial_density = 0.25;
  p.router.temporal_density = 0.25;
  return p;
}

ModelPreset make(std::string name, std::string description, VideoGrid grid, std::int64_t heads, std::int64_t head_dim,
                 std::int64_t layers, std::int64_t steps, std::int64_t dense_steps) {
  ModelPreset p{std::move(name), std::move(description), grid, heads, head_dim, layers, steps,
                starting_policy(dense_steps)};
  p.layout().validate();
  p.policy.validate();
  return p;
}

// `p` with K and V of `kv_heads` heads (grouped-query attention).
ModelPreset with_kv_heads(ModelPreset p, std::int64_t kv_heads) {
  p.kv_heads = kv_heads;
  return p;
}

// Wan2.2 A14B at one resolution: two experts (high-noise, low-noise) of Wan2.1-14B's shape, 40 steps.
ModelPreset wan22_a14b(const std::string& resolution, const std::string& pixels, VideoGrid grid) {
  return make("wan2.2-a14b-" + resolution,
              "Wan2.2-T2V/I2V-A14B, " + pixels + ", 81 frames: " + std::to_string(grid.frames) + " x " +
                  std::to_string(grid.height) + " x " + std::to_string(grid.width) +
                  " tokens; two experts (high-noise, low-noise) of Wan2.1-14B's shape, 40 steps",
              grid, 40, 128, 40, 40, 10);
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      make("wan2.1-480p", "Wan2.1-T2V-14B, 480x832, 81 frames: 21 x 30 x 52 tokens, text via cross-attention only",
           VideoGrid{21, 30, 52, 0, TextPlacement::After}, 40, 128, 40, 50, 12),
      make("wan2.1-720p", "Wan2.1-T2V-14B, 720x1280, 81 frames: 21 x 45 x 80 tokens, text via cross-attention only",
           VideoGrid{21, 45, 80, 0, TextPlacement::After}, 40, 128, 40, 50, 12),
      make("wan2.1-1.3b-480p", "Wan2.1-T2V-1.3B, 480x832, 81 frames: 21 x 30 x 52 tokens, 12 heads, 30 layers",
           VideoGrid{21, 30, 52, 0, TextPlacement::After}, 12, 128, 30, 50, 12),
      wan22_a14b("480p", "480x832", VideoGrid{21, 30, 52, 0, TextPlacement::After}),
      wan22_a14b("720p", "720x1280", VideoGrid{21, 45, 80, 0, TextPlacement::After}),
      make("wan2.2-5b-720p",
           "Wan2.2-TI2V-5B, 704x1280, 121 frames: 31 x 22 x 40 tokens (its VAE compresses 16x spatially), "
           "24 heads, 30 layers",
           VideoGrid{31, 22, 40, 0, TextPlacement::After}, 24, 128, 30, 50, 12),
      make("hunyuan-720p",
           "HunyuanVideo, 720x1280, 129 frames: 33 x 45 x 80 tokens + 256 text tokens after the video (joint "
           "attention); 20 double-stream + 40 single-stream blocks",
           VideoGrid{33, 45, 80, 256, TextPlacement::After}, 24, 128, 60, 50, 12),
      make("ltx-video",
           "LTX-Video (2B, diffusers' LTXPipeline defaults), 704x512, 161 frames: 21 x 16 x 22 tokens (its VAE "
           "compresses 32x spatially, 8x in time), 32 heads of 64, 28 layers",
           VideoGrid{21, 16, 22, 0, TextPlacement::After}, 32, 64, 28, 50, 12),
      make("ltx-2",
           "LTX-2 (19B, diffusers' LTX2Pipeline defaults), 768x512, 121 frames: 16 x 16 x 24 video tokens (its VAE "
           "compresses 32x spatially, 8x in time; the audio stream is left dense), 32 heads of 128, 48 layers, 30 steps",
           VideoGrid{16, 16, 24, 0, TextPlacement::After}, 32, 128, 48, 30, 8),
      make("ltx-2-1080p",
           "LTX-2 (19B), 1920x1088, 121 frames: 16 x 34 x 60 video tokens, 32 heads of 128, 48 layers, 30 steps",
           VideoGrid{16, 34, 60, 0, TextPlacement::After}, 32, 128, 48, 30, 8),
      make("hunyuan1.5-480p",
           "HunyuanVideo 1.5 T2V, 480x848, 121 frames: 31 x 30 x 53 tokens (its VAE compresses 16x spatially; "
           "1x1x1 patches) + the prompt at its longest after the video (1,000 Qwen + 256 ByT5 tokens; the mask "
           "keeps a prompt's own), 16 heads, 54 dual-stream blocks",
           VideoGrid{31, 30, 53, 1256, TextPlacement::After}, 16, 128, 54, 50, 12),
      make("hunyuan1.5-720p",
           "HunyuanVideo 1.5 T2V, 720x1280, 121 frames: 31 x 45 x 80 tokens + the prompt at its longest after "
           "the video (1,256 tokens), 16 heads, 54 dual-stream blocks",
           VideoGrid{31, 45, 80, 1256, TextPlacement::After}, 16, 128, 54, 50, 12),
      make("mochi-1-480p",
           "Mochi 1 preview, 480x848, 163 frames (5.4 s at 30 fps; its VAE compresses 6x in time): 28 x 30 x 53 "
           "tokens + the prompt at its longest after the video (256 tokens, joint attention), 24 heads, 48 layers, "
           "64 steps",
           VideoGrid{28, 30, 53, 256, TextPlacement::After}, 24, 128, 48, 64, 16),
      make("framepack-720p",
           "HunyuanVideo Framepack, 720x1280, one section of 9 latent frames: 9 x 45 x 80 tokens + after them "
           "the history (1x: 2 frames, 7,200 tokens; 2x: 920; 4x: 960), the image's 729 and the prompt's 256 at "
           "its longest; HunyuanVideo's 24 heads, 20 double-stream + 40 single-stream blocks",
           VideoGrid{9, 45, 80, 9080 + 729 + 256, TextPlacement::After}, 24, 128, 60, 50, 12),
      make("skyreels-v2-14b-540p",
           "SkyReels-V2-T2V-14B-540P, 544x960, 97 frames: 25 x 34 x 60 tokens, text via cross-attention only",
           VideoGrid{25, 34, 60, 0, TextPlacement::After}, 40, 128, 40, 50, 12),
      make("skyreels-v2-14b-720p",
           "SkyReels-V2-T2V/I2V/DF-14B-720P, 720x1280, 121 frames (its recommended size): 31 x 45 x 80 tokens, "
           "text via cross-attention only",
           VideoGrid{31, 45, 80, 0, TextPlacement::After}, 40, 128, 40, 50, 12),
      make("cosmos-predict2.5-2b",
           "Cosmos-Predict2.5-2B, 704x1280, 93 frames: 24 x 44 x 80 tokens, text via cross-attention only, "
           "16 heads, 28 layers, 36 steps",
           VideoGrid{24, 44, 80, 0, TextPlacement::After}, 16, 128, 28, 36, 9),
      make("cosmos-predict2.5-14b",
           "Cosmos-Predict2.5-14B, 704x1280, 93 frames: 24 x 44 x 80 tokens, 40 heads, 36 layers, 36 steps",
           VideoGrid{24, 44, 80, 0, TextPlacement::After}, 40, 128, 36, 36, 9),
      with_kv_heads(
          make("cosmos3-720p",
               "Cosmos 3 Omni (Cosmos3OmniPipeline's defaults), 720x1280, 189 frames: 48 x 23 x 40 tokens (VAE 16x "
               "spatial, the 45 latent rows padded to 46, 2x2 patches), then the prompt's tokens, after the video "
               "for stsa (their count varies with the prompt; left out here); 32 heads (8 key heads), 36 layers, "
               "35 steps",
               VideoGrid{48, 23, 40, 0, TextPlacement::After}, 32, 128, 36, 35, 9),
          8),
      make("kandinsky5-lite",
           "Kandinsky 5.0 T2V Lite (5 s, dense attention), 512x768, 121 frames: 31 x 32 x 48 tokens, text via "
           "cross-attention only, 28 heads of 64, 32 visual blocks",
           VideoGrid{31, 32, 48, 0, TextPlacement::After}, 28, 64, 32, 50, 12),
      make("anyflow-14b-480p",
           "AnyFlow-Wan2.1-T2V-14B (flow-map distilled from Wan2.1-T2V-14B), 480x832, 81 frames: 21 x 30 x 52 "
           "tokens, text via cross-attention only, 4 steps (its published example; any of 1, 2, 4, 8, 16 works)",
           VideoGrid{21, 30, 52, 0, TextPlacement::After}, 40, 128, 40, 4, 1),
      make("helios-384p",
           "Helios-Base (HeliosPipeline defaults), 384x640, chunks of 33 frames: 9 x 24 x 40 tokens + before "
           "them the history moved after (short 2 frames, 1,920 tokens; mid 2 at 2x, 240; long 16 at 4x, 240), "
           "text via cross-attention only; Wan2.1-14B's 40 heads and 40 layers; 50 steps per chunk, each chunk "
           "a generation of its own",
           VideoGrid{9, 24, 40, 2400, TextPlacement::After}, 40, 128, 40, 50, 12),
      make("cogvideox1.5",
           "CogVideoX1.5-5B, 768x1360, 81 frames: 11 x 48 x 85 tokens + 226 text tokens before the video (joint "
           "attention)",
           VideoGrid{11, 48, 85, 226, TextPlacement::Before}, 48, 64, 42, 50, 12),
  };
  return presets;
}

const ModelPreset& model_preset(std::string_view name) {
  std::string names;
  for (const auto& p : model_presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  throw InvalidArgument(detail::concat("unknown model preset '", name, "' (available: ", names, ")"));
}

}  // namespace stsa
