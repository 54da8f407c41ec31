// `stsa`: plan, benchmark and route spatio-temporal sparse attention.
// Every option of every command is declared here and nowhere else: CLI11 2.1
// defines its validators (ExistingFile, NonNegativeNumber...) in every file that
// includes it, at ~5 s of compile time per file, ~14 s under ASan + UBSan. The
// commands run from their parsed options (commands.hpp). Every error ends as one
// line on stderr and exit code 2.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "stsa/error.hpp"
#include "stsa/policy.hpp"
#include "stsa/version.hpp"

namespace stsa::cli {
namespace {

// --frames --height --width --text --text-placement --preset
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

// After parsing: --preset's grid (and heads, head dim and K/V heads, where the command has
// them) in every shape option the command line did not give. An unknown name: InvalidArgument
// listing the presets.
void apply_preset(const CLI::App& command, GridArgs& grid, std::int64_t* heads, std::int64_t* head_dim,
                  std::int64_t* kv_heads = nullptr) {
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
  // The preset's K/V heads go with its heads (where --heads is given, K and V have as many unless --kv-heads says).
  if (kv_heads != nullptr && command.count("--heads") == 0) unless_given("--kv-heads", *kv_heads, preset.kv_heads);
}

void add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand("plan", "build a tile plan and print its statistics");
  add_grid_options(cmd, args->grid);
  cmd->add_option("--heads", args->heads, "attention heads (they share one plan)")->capture_default_str();
  cmd->add_option("--head-dim", args->head_dim, "head dimension")->capture_default_str();
  cmd->add_option("--mask", args->mask, "dense | spatial | temporal | frames")->capture_default_str();
  cmd->add_option("--density", args->density, "kept fraction of pairs, in [0, 1]")->capture_default_str();
  cmd->add_option("--tile", args->tile, "query tile rows (and key tile columns unless --tile-k)")->capture_default_str();
  cmd->add_option("--tile-k", args->tile_k, "key tile columns (multiple of 64)")
      ->check([](const std::string& text) {  // -1 stands for "left out": as --tile
        return std::string(text.starts_with('-') ? "must not be negative (leave it out to use --tile's)" : "");
      });
  cmd->add_option("--align", args->align, "exact | round (partial tiles become full or empty)")->capture_default_str();
  cmd->add_flag("--no-anchor", args->no_anchor, "drop the symmetric frame-0 anchor");
  auto* png = cmd->add_option("--png", args->png, "write a picture of the tile map (refuses to overwrite)");
  cmd->add_flag("--force", args->force, "allow --png to overwrite an existing file")->needs(png);
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->callback([args, cmd] {
    apply_preset(*cmd, args->grid, &args->heads, &args->head_dim);
    run_plan_command(*args);
  });
}

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "time the CPU kernel (or the CUDA one), dense vs sparse, checked against the fp64 reference");
  add_grid_options(cmd, args->grid);
  cmd->add_option("--batch", args->batch, "batch size")->capture_default_str();
  cmd->add_option("--heads", args->heads, "attention heads")->capture_default_str();
  cmd->add_option("--kv-heads", args->kv_heads,
                  "K and V heads, dividing --heads: grouped-query attention (CPU backend; 0: --heads)")
      ->capture_default_str();
  cmd->add_option("--head-dim", args->head_dim, "head dimension (the CPU kernels take 1 to 128)")
      ->capture_default_str();
  cmd->add_option("--mask", args->mask, "spatial | temporal | frames | dense; with --dist also mixed | routed")
      ->check(CLI::IsMember({"dense", "spatial", "temporal", "frames", "mixed", "routed"}))
      ->capture_default_str();
  cmd->add_option("--density", args->density, "kept fraction of pairs, in [0, 1]")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  CLI::Option* dtype = cmd->add_option("--dtype", args->dtype,
                                       "fp32 | bf16 | fp16 | fp8_e4m3 (inputs, and the output but for fp8, whose "
                                       "output is bf16; default bf16 with --backend cuda)")
                           ->check(CLI::IsMember({"fp32", "bf16", "fp16", "fp8_e4m3", "fp8"}))
                           ->capture_default_str();
  cmd->add_option("--align", args->align, "exact | round (partial tiles become full or empty)")
      ->check(CLI::IsMember({"exact", "round"}))
      ->capture_default_str();
  cmd->add_option("--tile", args->tile, "tile size (query rows = key columns; a multiple of 64)")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "threads (0: STSA_THREADS or all)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  cmd->add_option("--isa", args->isa,
                  "auto | scalar | avx2 | avx512 | amx (AVX-512 with AMX tiles for bf16, fp16 and fp8, any head dim "
                  "padded)")
      ->check(CLI::IsMember({"auto", "scalar", "avx2", "avx512", "amx"}))
      ->capture_default_str();
  cmd->add_option("--repeats", args->repeats, "timed runs (median; after one warm-up)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--check-rows", args->check_rows, "random rows checked against the fp64 reference")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  // (The check runs on the text: an unsigned parse alone would wrap "-1" around.)
  cmd->add_option("--seed", args->seed, "seed of the random inputs")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--backend", args->backend, "cpu | cuda (bf16 or fp16, head dims 64 and 128, a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--kernel", args->kernel, "with --backend cuda: auto | sm80 | sm90 | sm90-overlap | sm90-pingpong")
      ->capture_default_str();
  cmd->add_option("--work-order", args->work_order,
                  "with --backend cuda: auto | across-heads | head-by-head | heavy-first")
      ->check(CLI::IsMember({"auto", "across-heads", "head-by-head", "heavy-first"}))
      ->capture_default_str();
  cmd->add_option("--persistent-blocks", args->persistent_blocks,
                  "with --backend cuda: blocks of the persistent Hopper kernels (0: one per SM)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--block-schedule", args->block_schedule,
                  "with --backend cuda: balanced | round-robin | snake (how the persistent Hopper blocks share "
                  "the work)")
      ->check(CLI::IsMember({"balanced", "round-robin", "snake"}))
      ->capture_default_str();
  cmd->add_option("--max-tflop", args->max_tflop,
                  "the most work (TFLOP, warm-up included) a CPU or --dist benchmark starts; more is refused at "
                  "once (a shape typo), unless raised here")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->add_flag("--dist", args->dist, "run the sequence-parallel benchmark under mpirun instead");
  cmd->callback([args, dtype, cmd] {
    // The CUDA benchmark's work is bounded by the GPU's memory, and a GPU does it in seconds.
    STSA_CHECK(args->backend != "cuda" || cmd->count("--max-tflop") == 0, InvalidArgument,
               "--max-tflop bounds the CPU benchmark's work; it does not go with --backend cuda");
    // A preset's K/V heads where the backend takes them (the CPU's; the CUDA kernel runs them repeated).
    apply_preset(*cmd, args->grid, &args->heads, &args->head_dim, args->backend == "cpu" ? &args->kv_heads : nullptr);
    if (args->backend == "cuda" && dtype->count() == 0) args->dtype = "bf16";  // what the CUDA kernels read
    run_bench_command(*args);
  });
}

void add_route_command(CLI::App& app) {
  auto args = std::make_shared<RouteArgs>();
  args->grid.frames = 13;
  args->grid.height = 12;
  args->grid.width = 16;
  CLI::App* cmd = app.add_subcommand("route", "route every head to a spatial, temporal or dense mask and report errors");
  add_grid_options(cmd, args->grid);
  cmd->add_flag("--synthetic", args->synthetic, "synthetic heads with known kinds (not model data)");
  cmd->add_option("--q", args->q_path, "queries: .npy or .safetensors, shape [N, H, D] or [B, N, H, D] (see --memory)");
  cmd->add_option("--k", args->k_path, "keys (same shape and dtype as --q)");
  cmd->add_option("--v", args->v_path, "values (same shape and dtype as --q)");
  cmd->add_option("--tensor", args->tensor, "tensor name inside .safetensors files");
  cmd->add_option("--q-tensor", args->q_tensor, "tensor name for --q (overrides --tensor)");
  cmd->add_option("--k-tensor", args->k_tensor, "tensor name for --k (overrides --tensor)");
  cmd->add_option("--v-tensor", args->v_tensor, "tensor name for --v (overrides --tensor)");
  cmd->add_option("--memory", args->memory,
                  "axis order of the --q/--k/--v files: bnhd, or bhnd for [B, H, N, D] (PyTorch's "
                  "scaled_dot_product_attention order); also the synthetic data's and --save-inputs'")
      ->check(CLI::IsMember({"bnhd", "bhnd"}))
      ->capture_default_str();
  cmd->add_option("--save-inputs", args->save_inputs,
                  "synthetic: write q.npy, k.npy, v.npy into this folder (created if needed; existing files are "
                  "refused, never replaced)");
  cmd->add_option("--save-output", args->save_output,
                  "write the routed attention's O (in --out-dtype, frame-major tokens, --memory axis order) into "
                  "this .npy file (an existing file is refused, never replaced)");
  cmd->add_option("--batch", args->batch, "synthetic: batch entries")->capture_default_str();
  cmd->add_option("--heads", args->heads, "synthetic: heads")->capture_default_str();
  cmd->add_option("--head-dim", args->head_dim, "synthetic: head dimension (even)")->capture_default_str();
  cmd->add_option("--dtype", args->dtype, "synthetic: fp32 | bf16 | fp16 | fp8_e4m3")->capture_default_str();
  cmd->add_option("--out-dtype", args->out_dtype,
                  "O's dtype: fp32 (the errors are the sparsity's, not the output's rounding) | bf16 | fp16 (what a "
                  "model's attention returns: the attention time a model sees)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  cmd->add_option("--density", args->density, "kept fraction of each candidate mask, in [0, 1]")->capture_default_str();
  cmd->add_option("--samples", args->samples, "sampled query rows per head (every row where there are fewer tokens)")
      ->capture_default_str();
  cmd->add_option("--max-rel-l2", args->max_rel_l2, "heads whose best mask errs more stay dense (>= 0)")
      ->capture_default_str();
  cmd->add_flag("--frame-window", args->frame_window, "also try the frame-window mask");
  cmd->add_option("--seed", args->seed, "seed of the samples and the synthetic data")->capture_default_str();
  cmd->add_option("--backend", args->backend, "attention backend: cpu | reference | cuda (routing and the routed call on the GPU; bf16 or fp16 inputs)")->capture_default_str();
  cmd->add_option("--threads", args->threads, "threads of the router and the CPU backend (0: STSA_THREADS or all)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  cmd->add_option("--isa", args->isa,
                  "the router's and the CPU backend's: auto | scalar | avx2 | avx512 | amx (auto and amx: AMX tile "
                  "products for bf16, fp16 and fp8 where the CPU has them, any head dim padded)")
      ->check(CLI::IsMember({"auto", "scalar", "avx2", "avx512", "amx"}))
      ->capture_default_str();
  cmd->add_option("--scatter", args->scatter,
                  "temporal heads' O and LSE back to frame-major order: fused (stored in place by the attention, "
                  "where the backend can) | pass (a pass of its own)")
      ->check(CLI::IsMember({"fused", "pass"}))
      ->capture_default_str();
  cmd->add_option("--eval-rows", args->eval_rows, "rows checked against fp64 dense attention (0: all)")
      ->capture_default_str();
  cmd->add_option("--repeats", args->repeats,
                  "routing + attention runs whose median times are reported (more than 1: after an untimed warm-up; "
                  "1: one cold call)")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->callback([args, cmd] {
    // Options of one input source given with the other are refused, not ignored: the files' shapes and
    // dtype are what count with --q/--k/--v, and the tensor names name nothing in synthetic data.
    for (const char* name : {"--batch", "--heads", "--head-dim", "--dtype"})
      STSA_CHECK(args->synthetic || cmd->count(name) == 0, InvalidArgument, name,
                 " shapes synthetic data; with --q/--k/--v the files' shapes and dtype count");
    for (const char* name : {"--tensor", "--q-tensor", "--k-tensor", "--v-tensor"})
      STSA_CHECK(!args->synthetic || cmd->count(name) == 0, InvalidArgument, name,
                 " names a tensor of --q/--k/--v files; it does not go with --synthetic");
    apply_preset(*cmd, args->grid, &args->heads, &args->head_dim);
    run_route_command(*args);
  });
}

// CLI11 reads integers with strtoll / strtoull, which saturate out-of-range text (and
// take "010" as octal): every integer option's text passes check_integer_text first. It
// reads an empty text as 0 for a number (--density '' ran at density 0), and an empty
// path was taken as no path (--save-output '' wrote nothing, with no error): every
// other option refuses an empty value.
void check_option_texts(CLI::App& app) {
  for (CLI::App* command : app.get_subcommands([](CLI::App*) { return true; }))
    for (CLI::Option* option : command->get_options()) {
      if (option->get_type_size() == 0) continue;  // a flag
      const std::string type = option->get_type_name();
      const bool is_unsigned = type.rfind("UINT", 0) == 0;
      if (is_unsigned || type.rfind("INT", 0) == 0) {
        option->transform(CLI::Validator(
            [is_unsigned](std::string& text) { return check_integer_text(text, is_unsigned); }, ""));
      } else {
        option->transform(CLI::Validator(
            [](std::string& text) { return std::string(text.empty() ? "needs a value, got an empty one" : ""); }, ""));
      }
    }
}

}  // namespace
}  // namespace stsa::cli

namespace {

int fail(const std::string& what) {
  std::string line = what;
  for (char& c : line)
    if (c == '\n') c = ' ';
  std::fprintf(stderr, "stsa: error: %s\n", line.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"stsa: spatio-temporal sparse attention for video diffusion transformers.\n"
               "Run without arguments for a short demo."};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", "stsa " + std::string(stsa::version));
  stsa::cli::add_plan_command(app);
  stsa::cli::add_bench_command(app);
  stsa::cli::add_route_command(app);
  stsa::cli::check_option_texts(app);
  // Past a file size limit (ulimit -f), a write then fails with EFBIG, which the writers
  // report as one line, instead of the signal killing the process mid-file.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    // No command takes arguments after "--": CLI11 dropped a command named there (stsa -- plan ...)
    // and ran the demo instead.
    for (int i = 1; i < argc; ++i)
      if (std::string(argv[i]) == "--") return fail("no command takes arguments after \"--\" (see --help)");
    app.parse(argc, argv);
    if (app.get_subcommands().empty()) stsa::cli::run_demo();
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ConversionError& e) {  // CLI11 says only "Could not convert: --tile = 99999999999"
    return fail(std::string(e.what()) + ": not a number of the option's type, or outside its range (see --help)");
  } catch (const CLI::ParseError& e) {
    return fail(std::string(e.what()) + " (see --help)");
  } catch (const stsa::Error& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    return fail("out of memory");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  // What was printed must have reached its file: a full disk, a file size limit or a closed
  // stdout was exit code 0 with the output cut short.
  if (std::fflush(stdout) != 0 || std::ferror(stdout))
    return fail(std::string("writing to the standard output failed (") + std::strerror(errno) + ")");
  return 0;
}
