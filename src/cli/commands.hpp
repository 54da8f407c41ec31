// The `stsa` command's subcommands. main.cpp declares every option and dispatches;
// each command runs in its own file from its parsed options and throws stsa::Error
// on bad input, which main turns into one line on stderr and exit 2.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/options.hpp"
#include "stsa/routed.hpp"
#include "stsa/router.hpp"

namespace stsa::cli {

// Options of `stsa plan`.
struct PlanArgs {
  GridArgs grid;
  std::int64_t heads = 40, head_dim = 128;
  std::string mask = "spatial";
  double density = 0.25;
  int tile = 128;
  int tile_k = -1;  // -1: same as tile
  std::string align = "exact";
  bool no_anchor = false;
  std::string png;
  bool force = false;
  bool json = false;
};

// Options of `stsa bench`, shared by the single-process and the --dist path.
struct BenchArgs {
  GridArgs grid{21, 16, 16, 0, "after", ""};
  std::int64_t batch = 1, heads = 8, head_dim = 128;
  std::int64_t kv_heads = 0;  // K/V heads (grouped-query attention); 0: --heads
  std::string mask = "spatial";  // spatial | temporal | frames | dense
  double density = 0.25;
  std::string dtype = "fp32";
  std::string align = "exact";
  int tile = 128;
  int threads = 0;
  std::string isa = "auto";
  int repeats = 5;
  int check_rows = 64;
  std::uint64_t seed = 1;
  // The most work (TFLOP, every warm-up and timed call) the CPU benchmark starts: an hour at 1 TFLOP/s.
  // Every --preset runs under it at the default options (the largest, skyreels-v2-14b-720p: 1,918
  // TFLOP); --frames 2100 for 21 on the default grid (8,900 TFLOP) does not.
  double max_tflop = 3600;
  bool json = false;
  bool dist = false;
  std::string backend = "cpu";  // cpu | cuda
  std::string kernel = "auto";  // the CUDA kernel (--backend cuda)
  std::string work_order = "auto";  // --backend cuda
  int persistent_blocks = 0;                // --backend cuda; 0: one per SM
  std::string block_schedule = "round-robin";  // --backend cuda
};

// Options of `stsa route`.
struct RouteArgs {
  GridArgs grid;
  bool synthetic = false;
  std::string q_path, k_path, v_path;
  std::string tensor, q_tensor, k_tensor, v_tensor;
  std::string memory = "bnhd";  // axis order of the q/k/v files (and of synthetic data): "bnhd" or "bhnd"
  std::string save_inputs;      // synthetic: a folder to write q.npy, k.npy, v.npy into
  std::string save_output;      // a .npy file to write the routed attention's O into (out_dtype, --memory order)
  std::int64_t batch = 1, heads = 16, head_dim = 64;
  std::string dtype = "fp32";
  // O's dtype. fp32 by default: the reported errors are then the sparsity's and
  // the kernel's, not the output's rounding; bf16 / fp16 time what a model's call returns.
  std::string out_dtype = "fp32";
  double density = 0.25;
  int samples = 64;
  double max_rel_l2 = 0.5;
  bool frame_window = false;
  std::int64_t seed = 1;
  std::string backend = "cpu";
  int threads = 0;            // the router's and the CPU backend's (0: STSA_THREADS or all)
  std::string isa = "auto";   // the router's and the CPU backend's instruction set
  std::string scatter = "fused";  // the temporal heads' O and LSE: "fused" into the attention's stores, or a "pass"
  std::int64_t eval_rows = 128;
  int repeats = 1;  // > 1: one untimed warm-up, then medians of this many routing + attention runs
  bool json = false;
};

// The commands, as parsed: each prints its report (text, or JSON with --json).
void run_plan_command(const PlanArgs& args);    // cmd_plan.cpp
void run_bench_command(const BenchArgs& args);  // cmd_bench.cpp (--dist: cmd_bench_dist.cpp)
void run_route_command(const RouteArgs& args);  // cmd_route.cpp
void run_demo();                                // cmd_demo.cpp: `stsa` with no arguments

// Routes every head and runs the routed attention; returns the JSON record (also used by the demo).
nlohmann::json run_route(const RouteArgs& args);

// One routed call and what it cost.
struct RoutedRun {
  RoutingReport report;  // the decisions, every candidate's error, the routing times
  RoutedResult result;   // what ran: temporal heads, permutation and attention times
  double copy_gbps = 0;  // copy bandwidth of the memory the permutation ran in
  std::string device;    // the GPU's name; empty on the host
};
// The routed call on the GPU (cmd_route_cuda.cpp: cuda_route, then
// cuda_run_routed) on device copies of `host`'s tensors; host.o and host.lse
// receive the output. Of two calls the second is reported (the first creates
// the scratch pool and uploads the plans). Unsupported without a GPU or in a
// build without CUDA.
RoutedRun route_on_cuda(const Router& router, const RoutedCall& host, const RoutedOptions& options);
// Throws Unsupported unless this build has the CUDA backend and a GPU is present:
// checked before the inputs are read or drawn.
void require_cuda_device();

// Runs the single-process CPU benchmark and returns its JSON record (also used by the demo).
nlohmann::json run_cpu_bench(const BenchArgs& args, bool progress);
// The same for the CUDA backend (cmd_bench_cuda.cpp; Unsupported without a GPU
// or in a build without CUDA), and its text form.
nlohmann::json run_cuda_bench(const BenchArgs& args, bool progress);
void print_cuda_bench(const nlohmann::json& record);
// Runs the distributed benchmark under mpirun (cmd_bench_dist.cpp); returns the process exit code.
int run_dist_bench(const BenchArgs& args);

// A number of a benchmark record; NaN for null (JSON's form of NaN, bench::json_number).
inline double json_double(const nlohmann::json& value) {
  return value.is_null() ? std::numeric_limits<double>::quiet_NaN() : value.get<double>();
}

// Writes "stsa: <what>... <percent>%" to stderr, rate-limited, only once a task has run > 2 s.
class Progress {
 public:
  explicit Progress(std::string what, bool enabled = true);
  void update(double fraction);
  ~Progress();

 private:
  std::string what_;
  bool enabled_;
  double start_s_;
  double last_print_s_ = -1.0;
  bool printed_ = false;
};

}  // namespace stsa::cli
