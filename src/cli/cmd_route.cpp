// `stsa route`: route every head of one attention call (synthetic heads with a
// known kind, or Q/K/V dumped from a model), run the routed sparse attention on
// a backend and report decisions, errors and costs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "bench/samples.hpp"
#include "cli/commands.hpp"
#include "cli/json_text.hpp"
#include "cli/options.hpp"
#include "stsa/attention.hpp"
#include "stsa/cpu.hpp"
#include "stsa/error.hpp"
#include "stsa/io.hpp"
#include "stsa/permute.hpp"
#include "stsa/route_eval.hpp"
#include "stsa/routed.hpp"
#include "stsa/router.hpp"
#include "stsa/synth.hpp"

namespace stsa::cli {
namespace {


struct Inputs {
  VideoLayout layout;
  Tensor q, k, v;
  std::vector<Route> truth;  // empty without ground truth
};

MemoryLayout parse_memory(const std::string& name) {
  STSA_CHECK(name == "bnhd" || name == "bhnd", InvalidArgument, "--memory must be bnhd or bhnd, got '", name, "'");
  return name == "bhnd" ? MemoryLayout::BHND : MemoryLayout::BNHD;
}

// One of q/k/v from a file: [N, H, D] or [B, N, H, D] (BHND: [H, N, D] or [B, H, N, D]), N matching the grid.
io::HostArray load(const std::string& what, const std::string& path, const std::string& tensor,
                   const VideoGrid& grid, MemoryLayout memory) {
  io::HostArray a = io::read_array(path, tensor);
  const bool bhnd = memory == MemoryLayout::BHND;
  STSA_CHECK(a.shape.size() == 3 || a.shape.size() == 4, InvalidArgument, path, ": ", what, " must have shape ",
             bhnd ? "[H, N, D] or [B, H, N, D]" : "[N, H, D] or [B, N, H, D]", ", got ", a.shape.size(),
             " dimensions");
  if (a.shape.size() == 3) a.shape.insert(a.shape.begin(), 1);
  for (std::int64_t d : a.shape) STSA_CHECK(d >= 1, InvalidArgument, path, ": ", what, " has an empty dimension");
  const std::size_t token_axis = bhnd ? 2 : 1, head_axis = bhnd ? 1 : 2;
  if (a.shape[token_axis] != grid.tokens() && a.shape[head_axis] == grid.tokens())
    throw InvalidArgument(path + ": " + what + " has the grid's " + std::to_string(grid.tokens()) +
                          " tokens on the heads' axis: for " + (bhnd ? "[B, N, H, D]" : "[B, H, N, D]") +
                          " files give --memory " + (bhnd ? "bnhd" : "bhnd"));
  STSA_CHECK(a.shape[token_axis] == grid.tokens(), InvalidArgument, path, ": ", what, " has ", a.shape[token_axis],
             " tokens but the grid ", grid.describe(), " has ", grid.tokens());
  return a;
}

Inputs read_inputs(const RouteArgs& args, const VideoGrid& grid, MemoryLayout memory) {
  STSA_CHECK(!args.q_path.empty() && !args.k_path.empty() && !args.v_path.empty(), InvalidArgument,
             "give --synthetic, or all of --q, --k and --v");
  STSA_CHECK(args.save_inputs.empty(), InvalidArgument, "--save-inputs writes synthetic inputs; it needs --synthetic");
  auto name = [&](const std::string& own) { return own.empty() ? args.tensor : own; };
  // Each file's bytes become its tensor as they are (its C order is the tensor's
  // memory order), one file at a time: the inputs are held once, not twice.
  const bool bhnd = memory == MemoryLayout::BHND;
  Inputs in;
  std::vector<std::int64_t> shape;
  DType dtype = DType::F32;
  const std::size_t head_axis = bhnd ? 1 : 2;
  std::int64_t kv_heads = 0;  // k's, which v must have too (fewer than q's: grouped-query attention)
  auto read = [&](const char* what, const std::string& path, const std::string& own_tensor) {
    io::HostArray a = load(what, path, name(own_tensor), grid, memory);
    if (shape.empty()) {
      shape = a.shape;
      dtype = a.dtype;
      in.layout = VideoLayout{grid, shape[0], shape[head_axis], shape[3]};
      in.layout.validate();
    } else if (kv_heads == 0) {
      kv_heads = a.shape[head_axis];
    }
    // q's shape but for K and V's heads, which the router checks divide q's.
    std::vector<std::int64_t> expected = shape;
    if (kv_heads != 0) expected[head_axis] = kv_heads;
    STSA_CHECK(a.shape == expected, InvalidArgument, "q, k and v shapes differ (", args.q_path, ", ", args.k_path,
               ", ", args.v_path, "; k and v may hold fewer heads than q, the same count)");
    STSA_CHECK(a.dtype == dtype, InvalidArgument, "q, k and v dtypes differ (", path, " holds ", to_string(a.dtype),
               ", ", args.q_path, " ", to_string(dtype), ")");
    const VideoLayout& l = in.layout;
    return Tensor(std::move(a.data), a.dtype, l.batch, l.tokens(), a.shape[head_axis], l.head_dim, memory);
  };
  in.q = read("q", args.q_path, args.q_tensor);
  in.k = read("k", args.k_path, args.k_tensor);
  in.v = read("v", args.v_path, args.v_tensor);
  return in;
}

constexpr const char* kSavedNames[] = {"q.npy", "k.npy", "v.npy"};

// --save-inputs' folder: refused when any of the three files exists (nothing is
// replaced); checked before the data is made.
void check_save_folder(const std::string& folder) {
  const std::filesystem::path dir(folder);
  std::error_code error;
  for (const char* name : kSavedNames)
    STSA_CHECK(!std::filesystem::exists(dir / name, error), InvalidArgument, "--save-inputs: ", (dir / name).string(),
               " exists; it is left as it is");
}

// The same path, however written (relative, with dots), whether or not it exists yet.
bool same_path(const std::filesystem::path& a, const std::filesystem::path& b) {
  const auto normal = [](const std::filesystem::path& p) {
    std::error_code error;
    std::filesystem::path n = std::filesystem::weakly_canonical(std::filesystem::absolute(p, error), error);
    return n.has_filename() ? n : n.parent_path();  // "dir/" is "dir"
  };
  return normal(a) == normal(b);
}

// --save-output's file: refused when it exists (nothing is replaced), when it is one of the files
// --save-inputs writes, or when its folder does not exist and is not the one --save-inputs creates;
// checked before any work.
void check_output_file(const std::string& path, const std::string& inputs_folder) {
  const std::filesystem::path file(path), folder = file.parent_path();
  std::error_code error;
  STSA_CHECK(!std::filesystem::exists(file, error), InvalidArgument, "--save-output: ", path,
             " exists; it is left as it is");
  if (!inputs_folder.empty())
    for (const char* name : kSavedNames)
      STSA_CHECK(!same_path(file, std::filesystem::path(inputs_folder) / name), InvalidArgument, "--save-output: ",
                 path, " is one of the files --save-inputs writes");
  STSA_CHECK(folder.empty() || std::filesystem::is_directory(folder, error) ||
                 (!inputs_folder.empty() && same_path(folder, inputs_folder)),
             InvalidArgument, "--save-output: no folder ", folder.string());
}

// A contiguous tensor as an array in its memory order: [B, N, H, D], or [B, H, N, D] for BHND.
io::HostArray as_array(const Tensor& t, MemoryLayout memory) {
  const TensorView v = t.view();
  io::HostArray a;
  a.dtype = t.dtype();
  a.shape = memory == MemoryLayout::BHND ? std::vector<std::int64_t>{v.batch(), v.heads(), v.tokens(), v.head_dim()}
                                         : std::vector<std::int64_t>{v.batch(), v.tokens(), v.heads(), v.head_dim()};
  const auto* bytes = static_cast<const std::byte*>(v.data);
  a.data.assign(bytes, bytes + t.bytes());
  return a;
}

// The synthetic q, k, v as .npy files, each in the tensors' memory order, into `folder`
// (created when missing). All three or none: a failed write (disk full) removes the files
// this call wrote before it.
void save_inputs(const Inputs& in, const std::string& folder, MemoryLayout memory) {
  const std::filesystem::path dir(folder);
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  STSA_CHECK(!error, InvalidArgument, "--save-inputs: cannot create ", folder, ": ", error.message());
  const Tensor* tensors[] = {&in.q, &in.k, &in.v};
  for (int i = 0; i < 3; ++i) {
    try {
      io::write_npy((dir / kSavedNames[i]).string(), as_array(*tensors[i], memory));
    } catch (const Error&) {
      std::error_code ignored;
      for (int j = 0; j < i; ++j) std::filesystem::remove(dir / kSavedNames[j], ignored);
      throw;
    }
  }
}

Inputs make_inputs(const RouteArgs& args, const VideoGrid& grid, MemoryLayout memory) {
  if (!args.synthetic) return read_inputs(args, grid, memory);
  STSA_CHECK(args.q_path.empty() && args.k_path.empty() && args.v_path.empty(), InvalidArgument,
             "--synthetic and --q/--k/--v exclude each other");
  synth::Options o;
  o.grid = grid;
  o.batch = args.batch;
  o.heads = args.heads;
  o.head_dim = args.head_dim;
  o.dtype = parse_dtype(args.dtype);
  o.memory = memory;
  o.seed = std::uint64_t(args.seed);
  if (!args.save_inputs.empty()) check_save_folder(args.save_inputs);
  synth::Data d = synth::make_video_tokens(o);
  return Inputs{d.layout, std::move(d.q), std::move(d.k), std::move(d.v), std::move(d.truth)};
}

}  // namespace

nlohmann::json run_route(const RouteArgs& args) {
  const VideoGrid grid = args.grid.grid();
  RouterOptions ro;
  ro.samples = args.samples;
  ro.spatial_density = ro.temporal_density = ro.frame_window_density = args.density;
  ro.try_frame_window = args.frame_window;
  ro.max_rel_l2 = args.max_rel_l2;
  STSA_CHECK(args.seed >= 0, InvalidArgument, "--seed must be >= 0, got ", args.seed);
  ro.seed = std::uint64_t(args.seed);
  const bool on_gpu = args.backend == "cuda";
  STSA_CHECK(!on_gpu || (args.threads == 0 && args.isa == "auto"), InvalidArgument,
             "--threads and --isa choose the CPU router's and kernel's; they do not go with --backend cuda");
  ro.threads = args.threads;
  ro.isa = parse_isa(args.isa);
  ro.validate();
  STSA_CHECK(args.eval_rows >= 0, InvalidArgument, "--eval-rows must be >= 0 (0: all rows), got ", args.eval_rows);
  STSA_CHECK(args.repeats >= 1 && args.repeats <= 1000, InvalidArgument, "--repeats must be in [1, 1000], got ",
             args.repeats);
  const Isa host_isa = resolve_isa(ro.isa);  // the router's on the host (Unsupported here for amx without AMX)
  // Tiles or vectors, and how many threads, as asked: the registry's CPU backend takes the defaults.
  const std::unique_ptr<Backend> cpu_backend =
      args.backend == "cpu" ? make_cpu_backend({host_isa, resolve_threads(args.threads)}) : nullptr;
  const Backend* host_backend = on_gpu ? nullptr : cpu_backend ? cpu_backend.get() : &stsa::backend(args.backend);
  const Router router(ro);

  if (on_gpu) require_cuda_device();
  STSA_CHECK(!on_gpu || !args.synthetic || parse_dtype(args.dtype) != DType::F32, Unsupported,
             "--backend cuda: the GPU router takes bf16 or fp16 inputs; add --dtype bf16");
  const MemoryLayout memory = parse_memory(args.memory);
  if (!args.save_output.empty()) check_output_file(args.save_output, args.synthetic ? args.save_inputs : "");
  if (args.synthetic) {
    // What this command holds at once, counted together before the first buffer is made: each could
    // fit alone where all do not, and then the first write past memory meets the OOM killer, not an error.
    const VideoLayout wanted{grid, args.batch, args.heads, args.head_dim};
    wanted.validate();
    const auto values = std::uint64_t(wanted.batch * wanted.tokens() * wanted.heads * wanted.head_dim);
    const auto lse_values = std::uint64_t(wanted.batch * wanted.heads * wanted.tokens());
    const std::uint64_t bytes = values * (3 * element_size(parse_dtype(args.dtype))) +
                                values * element_size(parse_dtype(args.out_dtype)) + lse_values * sizeof(float);
    check_host_allocation(bytes, "the synthetic Q/K/V, the output and its LSE");
  }
  Inputs in = make_inputs(args, grid, memory);
  const VideoLayout& layout = in.layout;

  Tensor o(parse_dtype(args.out_dtype), layout.batch, layout.tokens(), layout.heads, layout.head_dim, memory);
  LseBuffer lse(layout.batch, layout.heads, layout.tokens());
  RoutedCall call{layout, in.q.view(), in.k.view(), in.v.view(), o.view(), lse.view()};
  RoutedOptions options;
  options.fuse_scatter = args.scatter == "fused";
  if (!on_gpu) {  // refuse what the backend cannot run before spending time on routing
    const Support s = host_backend->supports(call.unrouted_call());
    STSA_CHECK(s.ok, Unsupported, "backend ", args.backend, ": ", s.why);
  }
  // Saved once the call is known to run here: a refused one left the three files (and their folder).
  if (args.synthetic && !args.save_inputs.empty()) save_inputs(in, args.save_inputs, memory);
  PlanCache plans;  // kept across repeats, as a model's layers keep theirs
  const auto route_and_run = [&] {
    if (on_gpu) return route_on_cuda(router, call, options);
    RoutedRun r;
    r.report = router.route(layout, call.q, call.k, call.v);
    r.result = run_routed(*host_backend, plans, call, r.report.heads, options);
    return r;
  };
  // One call measures a cold start (threads, buffers, plans); with --repeats the
  // times are medians of warm calls, the share a model's steady state sees.
  if (args.repeats > 1) route_and_run();
  RoutedRun routed;
  std::vector<double> routing_ms, attention_ms, permutation_ms;
  for (int i = 0; i < args.repeats; ++i) {
    routed = route_and_run();
    routing_ms.push_back(routed.report.routing_ms);
    attention_ms.push_back(routed.result.attention_ms);
    permutation_ms.push_back(routed.result.permutation_ms);
  }
  routed.report.routing_ms = bench::median(routing_ms);
  routed.result.attention_ms = bench::median(attention_ms);
  routed.result.permutation_ms = bench::median(permutation_ms);
  if (!on_gpu) routed.copy_gbps = measure_copy_gbps();
  const RoutingReport& report = routed.report;
  const RoutedResult& run = routed.result;
  const double copy_gbps = routed.copy_gbps;
  if (!args.save_output.empty()) io::write_npy(args.save_output, as_array(o, memory));
  const RouteEvaluation eval = evaluate_routes(layout, call.q, call.k, call.v, call.o, report.heads, args.eval_rows,
                                               std::uint64_t(args.seed));

  nlohmann::json per_head = nlohmann::json::array(), decisions = nlohmann::json::array();
  std::int64_t correct = 0;
  for (std::size_t h = 0; h < report.heads.size(); ++h) {
    const HeadRoute& r = report.heads[h];
    nlohmann::json candidates = nlohmann::json::array();
    for (const auto& c : r.candidates)
      candidates.push_back({{"mask", std::string(to_string(c.route))}, {"spec", c.spec.describe()}, {"mse", c.mse},
                            {"rel_l2", c.rel_l2}});
    nlohmann::json entry = {{"head", h},
                            {"decision", std::string(to_string(r.route))},
                            {"mask", r.spec.describe()},
                            {"candidates", candidates},
                            {"rel_l2_err", relative_l2(eval.routed_squared_error[h], eval.reference_squared[h])}};
    if (!in.truth.empty()) {
      entry["truth"] = std::string(to_string(in.truth[h]));
      correct += r.route == in.truth[h];
    }
    per_head.push_back(entry);
    decisions.push_back(std::string(to_string(r.route)));
  }
  const std::vector<Route> temporal{Route::Temporal}, spatial{Route::Spatial};
  // A group with no head has no error (null; "none" in the text), not an error of 0.
  const auto group_error = [&](const std::vector<double>& errors, const std::vector<Route>& routes) {
    const bool any = std::any_of(report.heads.begin(), report.heads.end(), [&](const HeadRoute& h) {
      return std::find(routes.begin(), routes.end(), h.route) != routes.end();
    });
    return any ? nlohmann::json(eval.rel_l2(errors, report.heads, routes)) : nlohmann::json(nullptr);
  };
  const double overhead_ms = report.routing_ms + run.permutation_ms;
  return {
      {"grid", grid.describe()},
      {"tokens", layout.tokens()},
      {"batch", layout.batch},
      {"heads", layout.heads},
      {"head_dim", layout.head_dim},
      {"dtype", std::string(to_string(in.q.dtype()))},
      {"out_dtype", std::string(to_string(o.dtype()))},
      {"source", args.synthetic ? "synthetic" : "files"},
      {"memory", args.memory},
      {"output_file", args.save_output.empty() ? nlohmann::json(nullptr) : nlohmann::json(args.save_output)},
      {"density", args.density},
      {"samples", args.samples},
      {"sampled_rows", report.sampled_rows.size()},  // fewer than samples where the call has fewer tokens
      {"backend", on_gpu ? std::string("cuda") : std::string(host_backend->name())},
      {"isa", on_gpu ? nlohmann::json(nullptr) : nlohmann::json(std::string(to_string(host_isa)))},
      {"device", routed.device.empty() ? nlohmann::json(nullptr) : nlohmann::json(routed.device)},
      {"accuracy", in.truth.empty() ? nlohmann::json(nullptr)
                                    : nlohmann::json(double(correct) / double(layout.heads))},
      {"decisions", decisions},
      {"per_head", per_head},
      {"eval_rows", eval.rows.size()},
      {"rel_l2_err", eval.rel_l2(eval.routed_squared_error, report.heads)},
      {"rel_l2_err_first_block_anchor", eval.rel_l2(eval.first_block_squared_error, report.heads)},
      {"rel_l2_err_temporal", group_error(eval.routed_squared_error, temporal)},
      {"rel_l2_err_first_block_anchor_temporal", group_error(eval.first_block_squared_error, temporal)},
      {"rel_l2_err_spatial", group_error(eval.routed_squared_error, spatial)},
      {"rel_l2_err_first_block_anchor_spatial", group_error(eval.first_block_squared_error, spatial)},
      {"routing_ms", report.routing_ms},
      {"routing_device_ms", on_gpu ? nlohmann::json(report.routing_device_ms) : nlohmann::json(nullptr)},
      {"routing_gflop", report.flops / 1e9},
      {"routing_tile_products", report.tile_products},
      {"routing_product_units",
       report.product_units ? nlohmann::json(to_string(*report.product_units)) : nlohmann::json(nullptr)},
      {"attention_ms", run.attention_ms},
      {"attention_gflop", run.kept_tile_flops / 1e9},
      {"permutation_ms", run.permutation_ms},
      {"permutation_gbps", run.permutation_gbps()},
      {"scatter_fused", run.scatter_fused},
      {"gather_fused", run.gather_fused},
      {"copy_gbps", copy_gbps},
      {"permutation_fraction_of_copy", copy_gbps > 0 ? run.permutation_gbps() / copy_gbps : 0.0},
      {"routing_share", run.attention_ms > 0 ? overhead_ms / run.attention_ms : 0.0},
      {"repeats", args.repeats},
  };
}

namespace {

void print_text(const nlohmann::json& r) {
  std::printf("grid %s, %lld heads x %lld dims, %s %s inputs, density %.3f, backend %s%s%s\n",
              r["grid"].get<std::string>().c_str(), (long long)r["heads"].get<std::int64_t>(),
              (long long)r["head_dim"].get<std::int64_t>(), r["source"].get<std::string>().c_str(),
              r["dtype"].get<std::string>().c_str(), r["density"].get<double>(), r["backend"].get<std::string>().c_str(),
              r["isa"].is_null() ? "" : ", isa ", r["isa"].is_null() ? "" : r["isa"].get<std::string>().c_str());
  if (!r["device"].is_null()) std::printf("device %s\n", r["device"].get<std::string>().c_str());
  for (const auto& h : r["per_head"]) {
    std::printf("head %3lld: %-8s", (long long)h["head"].get<std::int64_t>(), h["decision"].get<std::string>().c_str());
    for (const auto& c : h["candidates"])
      std::printf("  %s mse %.3e rel %.4f", c["mask"].get<std::string>().c_str(), c["mse"].get<double>(),
                  c["rel_l2"].get<double>());
    if (h.contains("truth")) std::printf("  [truth %s]", h["truth"].get<std::string>().c_str());
    std::printf("\n");
  }
  if (!r["accuracy"].is_null()) std::printf("accuracy against ground truth: %.4f\n", r["accuracy"].get<double>());
  const auto error_text = [](const nlohmann::json& e) {
    char text[32] = "none";
    if (!e.is_null()) std::snprintf(text, sizeof text, "%.5f", e.get<double>());
    return std::string(text);
  };
  std::printf("rel_l2_err vs dense (%lld rows): %.5f routed; %.5f with the first-block anchor "
              "(temporal heads %s vs %s, spatial heads %s vs %s)\n",
              (long long)r["eval_rows"].get<std::int64_t>(), r["rel_l2_err"].get<double>(),
              r["rel_l2_err_first_block_anchor"].get<double>(), error_text(r["rel_l2_err_temporal"]).c_str(),
              error_text(r["rel_l2_err_first_block_anchor_temporal"]).c_str(),
              error_text(r["rel_l2_err_spatial"]).c_str(),
              error_text(r["rel_l2_err_first_block_anchor_spatial"]).c_str());
  std::printf("routing %.2f ms (%lld sampled rows per head, %.3f GFLOP", r["routing_ms"].get<double>(),
              (long long)r["sampled_rows"].get<std::int64_t>(), r["routing_gflop"].get<double>());
  if (!r["routing_device_ms"].is_null()) std::printf("; its kernels %.2f ms", r["routing_device_ms"].get<double>());
  if (const auto& units = r["routing_product_units"]; !units.is_null() && units != "fma")
    std::printf("; %s", units == "amx" ? "AMX tile products" : "scores from bf16 dot products");
  std::printf("), permutation %.2f ms (%.2f GB/s = %.2f of the %.2f GB/s copy%s), "
              "attention %.2f ms; routing + permutation = %.2f%% of attention\n",
              r["permutation_ms"].get<double>(), r["permutation_gbps"].get<double>(),
              r["permutation_fraction_of_copy"].get<double>(), r["copy_gbps"].get<double>(),
              r["gather_fused"].get<bool>()    ? "; none: the kernel reads Q, K, V and stores O, LSE in place"
              : r["scatter_fused"].get<bool>() ? "; the gather alone: O and LSE stored in place by the kernel"
                                               : "",
              r["attention_ms"].get<double>(), 100.0 * r["routing_share"].get<double>());
}

}  // namespace

void run_route_command(const RouteArgs& args) {
  const nlohmann::json record = run_route(args);
  if (args.json) std::printf("%s\n", json_text(record).c_str());
  else print_text(record);
}

}  // namespace stsa::cli
