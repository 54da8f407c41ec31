// stsa_gpu_bench: times the CUDA backend on one video shape at several kept
// densities (spatial band masks with the frame-0 anchor; density >= 1 means the
// dense mask), once per attention kernel (--kernels), and the GPU token
// permutation. The timing loop, statistics and figures are the shared harness
// (src/bench: warm-up, median of the timed runs within a budget, TFLOP/s on
// kept tiles from stsa/flops.hpp); CUDA events time the runs
// (src/bench/cuda).
//
// A kernel that cannot run here, or a case that fails, is recorded under
// "errors" and the other kernels and cases still run. The JSON (--json) is
// rewritten after every case, atomically, so a process killed by its caller's
// timeout still leaves every finished case; --deadline-s stops starting cases.
// The permutation is timed first (it is quick and its 1440p figure is a
// target). Exit status: 0 all ran, 1 some failed or were skipped (the JSON is
// still written), 2 bad options or nothing ran.
//
// For the PyTorch comparison (compare.py) it can read Q/K/V from raw bf16 files
// ([B, N, H, D], C order), export every plan's full and partial tile lists, and
// write sampled output rows, so both sides run on identical data and plans.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <exception>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/cuda/event_stopwatch.hpp"
#include "cuda/cuda_check.hpp"
#include "bench/figures.hpp"
#include "bench/record.hpp"
#include "bench/timing_loop.hpp"
#include "stsa/attention.hpp"
#include "stsa/cuda.hpp"
#include "stsa/error.hpp"
#include "stsa/flops.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"

namespace {

using nlohmann::json;

struct Options {
  std::int64_t frames = 21, height = 45, width = 80, heads = 12, head_dim = 128, batch = 1;
  std::vector<double> densities{0.1, 0.2, 0.3, 0.5, 1.0};
  std::string dtype = "bf16";
  std::string kernels = "sm90,sm90-overlap,sm90-pingpong,sm80";
  std::string inputs;       // directory with q.bin, k.bin, v.bin
  std::string export_dir;   // plan_<label>.bin/.json and o_<label>.f32 go here
  int sample_rows = 0;
  int warmup = 1;
  int repeats = 5;
  double budget_s = 20.0;   // per case: stop repeating once the timed runs took this long
  double deadline_s = 0;    // > 0: start no case after this many seconds
  bool permutation = true;
  std::string json_path;
};

stsa::bench::TimedRuns time_gpu(const std::function<void()>& enqueue, const stsa::bench::TimingOptions& timing) {
  stsa::bench::CudaEventStopwatch events;  // on the default stream, where the runs are enqueued
  stsa::bench::Stopwatch* clocks[] = {&events};
  stsa::bench::TimedRuns runs = stsa::bench::time_runs(timing, enqueue, clocks);
  if (const std::string note = events.host_waits_note(); !note.empty()) std::cerr << "note: " << note << "\n";
  return runs;
}

// One timed variant of the backend: a kernel, a work order and a block schedule.
struct KernelSpec {
  stsa::CudaBackendOptions options;
  std::string name;  // as given: "sm90-pingpong", "sm90-pingpong+head-by-head+round-robin" (compare.py keys rows by it)
};

// "sm90,sm80+head-by-head,sm90+round-robin" -> the variants in the order given,
// each once; after the kernel, each "+" names a work order or a block schedule.
std::vector<KernelSpec> parse_kernels(const std::string& list) {
  std::vector<KernelSpec> specs;
  std::size_t begin = 0;
  while (begin <= list.size()) {
    const std::size_t end = std::min(list.find(',', begin), list.size());
    const std::string_view item = std::string_view(list).substr(begin, end - begin);
    std::size_t plus = item.find('+');
    KernelSpec spec;
    spec.options.kernel = stsa::parse_cuda_kernel(item.substr(0, plus));
    while (plus != std::string_view::npos) {
      const std::size_t next = item.find('+', plus + 1);
      const std::string_view modifier = item.substr(plus + 1, next == std::string_view::npos ? next : next - plus - 1);
      bool known = false;
      for (const auto order : {stsa::CudaWorkOrder::Auto, stsa::CudaWorkOrder::AcrossHeads,
                               stsa::CudaWorkOrder::HeadByHead, stsa::CudaWorkOrder::HeavyFirst})
        if (modifier == stsa::to_string(order)) {
          spec.options.work_order = order;
          known = true;
        }
      for (const auto schedule :
           {stsa::CudaBlockSchedule::Balanced, stsa::CudaBlockSchedule::RoundRobin, stsa::CudaBlockSchedule::Snake})
        if (modifier == stsa::to_string(schedule)) {
          spec.options.block_schedule = schedule;
          known = true;
        }
      STSA_CHECK(known, stsa::InvalidArgument, "unknown variant '", modifier, "' in kernel '", item,
                 "' (expected a work order: auto, across-heads, head-by-head, heavy-first; or a block schedule: "
                 "balanced, round-robin, snake)");
      plus = next;
    }
    spec.name = std::string(item);
    if (std::none_of(specs.begin(), specs.end(), [&](const KernelSpec& s) { return s.name == spec.name; }))
      specs.push_back(spec);
    begin = end + 1;
  }
  return specs;
}

std::vector<char> read_file(const std::string& path, std::size_t expected) {
  std::ifstream in(path, std::ios::binary);
  STSA_CHECK(in.good(), stsa::IoError, "cannot open ", path);
  in.seekg(0, std::ios::end);
  const auto size = std::size_t(in.tellg());
  STSA_CHECK(size == expected, stsa::IoError, path, " has ", size, " bytes, expected ", expected);
  in.seekg(0);
  std::vector<char> bytes(size);
  in.read(bytes.data(), std::streamsize(size));
  STSA_CHECK(in.good(), stsa::IoError, "short read of ", path);
  return bytes;
}

// Written next to `path` and renamed over it: a reader (or a kill) never sees
// half a file.
void write_file(const std::string& path, const void* data, std::size_t bytes) {
  const std::string partial = path + ".tmp";
  {
    std::ofstream out(partial, std::ios::binary);
    out.write(static_cast<const char*>(data), std::streamsize(bytes));
    out.close();  // the last flush can fail too (a full RAM disk): checked after it
    STSA_CHECK(!out.fail(), stsa::IoError, "cannot write ", partial);
  }
  STSA_CHECK(std::rename(partial.c_str(), path.c_str()) == 0, stsa::IoError, "cannot rename ", partial, " to ",
             path);
}

void write_json(const std::string& path, const json& value) {
  const std::string text = value.dump(2) + "\n";
  write_file(path, text.data(), text.size());
}

// Random values for timing runs without inputs: one 16M-element block of
// N(0, 1) rounded to the dtype, repeated (the values do not change the timing).
void fill_random(stsa::DeviceBuffer& buffer, stsa::DType dtype, std::uint64_t seed) {
  const std::size_t block = std::min<std::size_t>(buffer.bytes() / 2, std::size_t(1) << 24);
  std::vector<std::uint16_t> values(block);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  for (auto& v : values)
    v = dtype == stsa::DType::BF16 ? stsa::float_to_bf16(normal(rng)) : stsa::float_to_f16(normal(rng));
  for (std::size_t at = 0; at < buffer.bytes(); at += block * 2)
    buffer.copy_from_host(values.data(), std::min(block * 2, buffer.bytes() - at), at);
}

std::string case_label(double density) {
  if (density >= 1.0) return "dense";
  char text[32];
  std::snprintf(text, sizeof text, "s%.2f", density);
  return text;
}

// The plan's tile lists as CSR int32 arrays, for FlexAttention's BlockMask.
json export_plan(const stsa::TilePlan& plan, const std::string& path) {
  std::vector<std::int32_t> full_offsets{0}, full, partial_offsets{0}, partial;
  for (std::int64_t qt = 0; qt < plan.q_tiles(); ++qt) {
    for (auto kt : plan.full_tiles(qt)) full.push_back(kt);
    for (auto kt : plan.partial_tiles(qt)) partial.push_back(kt);
    full_offsets.push_back(std::int32_t(full.size()));
    partial_offsets.push_back(std::int32_t(partial.size()));
  }
  std::vector<std::int32_t> all;
  json sections = json::array();
  const std::pair<const char*, const std::vector<std::int32_t>*> arrays[] = {
      {"full_offsets", &full_offsets}, {"full_tiles", &full}, {"partial_offsets", &partial_offsets},
      {"partial_tiles", &partial}};
  for (const auto& [name, array] : arrays) {
    sections.push_back({{"name", name}, {"offset", all.size() * 4}, {"count", array->size()}});
    all.insert(all.end(), array->begin(), array->end());
  }
  write_file(path, all.data(), all.size() * 4);
  return {{"file", path}, {"dtype", "int32"}, {"sections", sections}};
}

// The result record and whether anything failed.
struct Outcome {
  json result;
  bool any_failed = false, any_ran = false;
};

Outcome run(const Options& opt) {
  // The deadline counts from here: reading 3 GB of inputs is part of the time.
  const auto started = std::chrono::steady_clock::now();
  const auto seconds_since_start = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };

  const stsa::DType dtype = stsa::parse_dtype(opt.dtype);
  STSA_CHECK(dtype != stsa::DType::F32, stsa::InvalidArgument, "the GPU benchmark takes bf16 or fp16");
  stsa::VideoLayout layout;
  layout.grid.frames = opt.frames;
  layout.grid.height = opt.height;
  layout.grid.width = opt.width;
  layout.batch = opt.batch;
  layout.heads = opt.heads;
  layout.head_dim = opt.head_dim;
  layout.validate();
  const std::int64_t n = layout.tokens();
  const std::vector<KernelSpec> kernels = parse_kernels(opt.kernels);
  const stsa::bench::TimingOptions timing{.warmup = opt.warmup, .repeats = opt.repeats, .budget_ms = opt.budget_s * 1e3};
  timing.validate();
  STSA_CHECK(opt.sample_rows >= 0, stsa::InvalidArgument, "--sample-rows must be >= 0, got ", opt.sample_rows);
  STSA_CHECK(opt.deadline_s >= 0, stsa::InvalidArgument, "--deadline-s must be >= 0, got ", opt.deadline_s);
  STSA_CHECK(stsa::cuda_device_count() > 0, stsa::Unsupported, "no CUDA device (", stsa::cuda_unavailable_reason(),
             ")");

  const stsa::CudaDeviceInfo device = stsa::cuda_device_info();
  std::cerr << "stsa_gpu_bench: " << device.name << ", " << layout.grid.describe() << " B=" << layout.batch
            << " H=" << layout.heads << " D=" << layout.head_dim << " " << opt.dtype << "\n";

  const std::size_t elements = std::size_t(layout.batch * n * layout.heads * layout.head_dim);
  const std::size_t bytes = elements * stsa::element_size(dtype);
  stsa::DeviceBuffer q(bytes), k(bytes), v(bytes), o(bytes);
  stsa::DeviceBuffer lse(std::size_t(layout.batch * layout.heads * n) * sizeof(float));
  if (!opt.inputs.empty()) {
    for (auto [name, buffer] : {std::pair<const char*, stsa::DeviceBuffer*>{"q", &q}, {"k", &k}, {"v", &v}}) {
      const auto host = read_file(opt.inputs + "/" + name + ".bin", bytes);
      buffer->copy_from_host(host.data(), bytes);
    }
  } else {
    fill_random(q, dtype, 1);
    fill_random(k, dtype, 2);
    fill_random(v, dtype, 3);
  }

  auto view = [&](const stsa::DeviceBuffer& b) {
    return stsa::TensorView::contiguous(b.data(), dtype, layout.batch, n, layout.heads, layout.head_dim,
                                        stsa::MemoryLayout::BNHD);
  };
  stsa::AttentionCall call;
  call.layout = layout;
  call.q = view(q);
  call.k = view(k);
  call.v = view(v);
  call.o = view(o);
  call.lse = stsa::LseView::contiguous(static_cast<float*>(lse.data()), layout.batch, layout.heads, n);

  std::vector<std::int64_t> sample;
  if (opt.sample_rows > 0) {
    const std::int64_t count = std::min<std::int64_t>(opt.sample_rows, n);
    for (std::int64_t i = 0; i < count; ++i) sample.push_back(count == 1 ? 0 : i * (n - 1) / (count - 1));
  }

  std::vector<std::string> kernel_names;
  for (const KernelSpec& kernel : kernels) kernel_names.push_back(kernel.name);
  Outcome outcome;
  json& result = outcome.result;
  result = {{"device", device.name},
            {"multiprocessors", device.multiprocessors},
            {"compute_capability", std::to_string(device.major) + "." + std::to_string(device.minor)},
            {"frames", opt.frames},
            {"height", opt.height},
            {"width", opt.width},
            {"tokens", n},
            {"batch", opt.batch},
            {"heads", opt.heads},
            {"head_dim", opt.head_dim},
            {"dtype", opt.dtype},
            {"kernels", kernel_names},
            {"warmup", opt.warmup},
            {"repeats", opt.repeats},
            {"budget_s", opt.budget_s},
            {"sample_rows", sample},
            {"cases", json::array()},
            {"errors", json::array()}};
  // Everything finished so far, on disk (when --json is given).
  const auto flush = [&] {
    if (!opt.json_path.empty()) write_json(opt.json_path, result);
  };
  const auto fail = [&](const std::string& kernel, const std::string& label, const std::string& what) {
    result["errors"].push_back({{"kernel", kernel}, {"label", label}, {"error", what}});
    outcome.any_failed = true;
    std::cerr << "  [" << kernel << "] " << (label.empty() ? "" : label + ": ") << "FAILED: " << what << "\n";
    flush();
  };
  flush();

  if (opt.permutation) {
    try {
      // Temporal heads: gather Q, K, V of every head into spatial-major order and
      // scatter O and LSE back, against a device-to-device copy of the same bytes.
      stsa::DeviceBuffer pq(bytes), pk(bytes), pv(bytes), po(bytes);
      stsa::DeviceBuffer plse(lse.bytes());
      std::vector<std::int64_t> all_heads(std::size_t(layout.heads));
      std::iota(all_heads.begin(), all_heads.end(), 0);
      const std::vector<stsa::TensorView> sources{call.q, call.k, call.v}, packed{view(pq), view(pk), view(pv)};
      const double gather_ms = time_gpu(
          [&] {
            stsa::cuda_gather_heads(layout.grid, stsa::TokenOrder::FrameMajor, stsa::TokenOrder::SpatialMajor,
                                    all_heads, sources, packed);
          },
          timing)[0].median_ms();
      const std::vector<stsa::TensorView> packed_o{view(po)}, dest_o{call.o};
      const auto packed_lse =
          stsa::LseView::contiguous(static_cast<float*>(plse.data()), layout.batch, layout.heads, n);
      const double scatter_ms = time_gpu(
          [&] {
            stsa::cuda_scatter_heads(layout.grid, stsa::TokenOrder::SpatialMajor, stsa::TokenOrder::FrameMajor,
                                     all_heads, packed_o, dest_o, packed_lse, call.lse);
          },
          timing)[0].median_ms();
      const double copy_ms = time_gpu(
          [&] {
            STSA_CUDA_CHECK(cudaMemcpyAsync(pq.data(), q.data(), bytes, cudaMemcpyDeviceToDevice));
          },
          timing)[0].median_ms();
      const double gather_bytes = stsa::permutation_bytes(layout, layout.heads, 3, stsa::element_size(dtype));
      const double scatter_bytes = stsa::permutation_bytes(layout, layout.heads, 1, stsa::element_size(dtype)) +
                                   2.0 * double(lse.bytes());
      const double copy_gbps = stsa::bench::gbps(2.0 * double(bytes), copy_ms);
      result["permutation"] = {{"gather_qkv_ms", gather_ms},
                               {"gather_gbps", stsa::bench::gbps(gather_bytes, gather_ms)},
                               {"scatter_o_lse_ms", scatter_ms},
                               {"scatter_gbps", stsa::bench::gbps(scatter_bytes, scatter_ms)},
                               {"copy_gbps", copy_gbps}};
      std::cerr << "  permutation: gather " << gather_ms << " ms, scatter " << scatter_ms << " ms, copy "
                << copy_gbps << " GB/s\n";
      flush();
    } catch (const std::exception& e) {  // stsa::Error, and bad_alloc or a JSON error too
      fail("permutation", "", e.what());
    }
  }

  // One backend per kernel; a kernel this GPU cannot run is reported once and left out.
  struct Runner {
    std::string name, resolved;
    std::unique_ptr<stsa::CudaBackend> backend;
  };
  std::vector<Runner> runners;
  for (const KernelSpec& kernel : kernels) {
    const std::string& name = kernel.name;
    try {
      auto backend = std::make_unique<stsa::CudaBackend>(kernel.options);
      const std::string resolved = std::string(stsa::to_string(backend->resolved_kernel())) +
                                   name.substr(std::min(name.find('+'), name.size()));  // and the work order
      runners.push_back({name, resolved, std::move(backend)});
    } catch (const std::exception& e) {  // stsa::Error, and bad_alloc or a JSON error too
      fail(name, "", e.what());
    }
  }

  const std::int64_t row_elements = layout.heads * layout.head_dim;
  const std::size_t row_bytes = std::size_t(row_elements) * stsa::element_size(dtype);
  for (const double density : opt.densities) {
    const std::string label = case_label(density);
    const stsa::MaskSpec spec = density >= 1.0 ? stsa::MaskSpec::dense()
                                               : stsa::mask_for_density(layout.grid, stsa::SparseKind::Spatial, density);
    const auto plan = stsa::TilePlan::build(layout.grid, spec);
    const auto& s = plan->stats();
    const stsa::bench::AttentionWork work = stsa::bench::attention_work(layout, *plan);
    call.heads.assign(std::size_t(layout.heads), stsa::HeadMask{spec, spec.natural_order(), plan, true});
    json plan_file;
    for (const Runner& runner : runners) {
      if (opt.deadline_s > 0 && seconds_since_start() >= opt.deadline_s) {
        fail(runner.name, label, "skipped: past --deadline-s");
        continue;
      }
      try {
        if (plan_file.is_null() && !opt.export_dir.empty())
          plan_file = export_plan(*plan, opt.export_dir + "/plan_" + label + ".bin");
        // Poisoned (NaN) before each kernel, so rows a kernel never writes cannot pass for another kernel's.
        o.fill_bytes(0xFF);
        const auto timed = time_gpu([&] { runner.backend->run_async(call, nullptr); }, timing);
        const stsa::bench::Samples& times = timed[0];
        const double ms = times.median_ms();
        json record = {{"label", label},
                       {"kernel", runner.name},
                       {"kernel_resolved", runner.resolved},
                       {"density", density},
                       {"mask", spec.describe()},
                       {"band", spec.band},
                       {"anchor", spec.anchor},
                       {"plan_build_ms", s.build_ms},
                       {"runs", times.runs()},
                       {"budget_spent", timed.budget_spent},
                       {"kept_tile_flops", work.kept_tile_flops},
                       {"tflops_kept_tiles", stsa::bench::tflops(work.kept_tile_flops, ms)},
                       {"tflops_kept_pairs", stsa::bench::tflops(work.kept_pair_flops, ms)},
                       {"tflops_dense_equivalent", stsa::bench::tflops(work.dense_flops, ms)},
                       {"dense_flops", work.dense_flops}};
        stsa::bench::add_plan_stats(record, s);
        stsa::bench::add_timing(record, "", times);  // ms (median), ms_min, ms_max, ms_runs
        // When the timed runs ran (epoch seconds), for compare.py's SM clock samples.
        record["wall_from_s"] = timed.wall_from_s;
        record["wall_to_s"] = timed.wall_to_s;
        std::cerr << "  [" << runner.name << "] " << label << ": " << ms << " ms, "
                  << record["tflops_kept_tiles"].get<double>() << " TFLOP/s on kept tiles (tile density "
                  << s.tile_density() << ")\n";
        if (!plan_file.is_null()) {
          record["plan"] = plan_file;
          if (!sample.empty()) {
            // O rows of batch 0 (BNHD: one row = all heads), as fp32 [rows, H, D];
            // row by row, not the whole of O (0.93 GB at 1440p).
            std::vector<std::uint16_t> row(static_cast<std::size_t>(row_elements));
            std::vector<float> rows;
            rows.reserve(sample.size() * std::size_t(row_elements));
            for (const std::int64_t r : sample) {
              o.copy_to_host(row.data(), row_bytes, std::size_t(r) * row_bytes);
              for (const std::uint16_t bits : row)
                rows.push_back(dtype == stsa::DType::BF16 ? stsa::bf16_to_float(bits) : stsa::f16_to_float(bits));
            }
            const std::string path = opt.export_dir + "/o_" + label + "_" + runner.name + ".f32";
            write_file(path, rows.data(), rows.size() * sizeof(float));
            record["sample_file"] = path;
          }
        }
        result["cases"].push_back(record);
        outcome.any_ran = true;
        flush();
      } catch (const std::exception& e) {  // stsa::Error, and bad_alloc or a JSON error too
        fail(runner.name, label, e.what());
      }
    }
  }
  return outcome;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"Times the stsa CUDA backend at one video shape (see bench/gpu/check.sh)."};
  app.add_option("--frames", opt.frames);
  app.add_option("--height", opt.height);
  app.add_option("--width", opt.width);
  app.add_option("--heads", opt.heads);
  app.add_option("--head-dim", opt.head_dim);
  app.add_option("--batch", opt.batch);
  app.add_option("--densities", opt.densities, "kept densities; 1 means the dense mask")->delimiter(',');
  app.add_option("--kernels", opt.kernels, "attention kernels to time, each on every case: comma list of auto, sm80, sm90, sm90-overlap, "
                 "sm90-pingpong, each optionally followed by +<work order> (auto, across-heads, head-by-head) and "
                 "+<block schedule> (balanced, round-robin)")
      ->capture_default_str();
  app.add_option("--dtype", opt.dtype, "bf16 | fp16");
  app.add_option("--inputs", opt.inputs, "directory with q.bin, k.bin, v.bin (raw [B, N, H, D])");
  app.add_option("--export", opt.export_dir, "directory for plan lists and sampled output rows");
  app.add_option("--sample-rows", opt.sample_rows, "output rows to write per case (needs --export)");
  app.add_option("--warmup", opt.warmup);
  app.add_option("--repeats", opt.repeats);
  app.add_option("--budget-s", opt.budget_s, "seconds of timed runs per case at most");
  app.add_option("--deadline-s", opt.deadline_s, "start no case after this many seconds (0: no deadline)");
  app.add_option("--permutation", opt.permutation, "also time the GPU permutation (true/false)");
  app.add_option("--json", opt.json_path, "write the results here (else stdout)");
  CLI11_PARSE(app, argc, argv);
  try {
    const Outcome outcome = run(opt);  // with --json, already written after every case
    if (opt.json_path.empty()) std::cout << outcome.result.dump(2) << "\n";
    if (!outcome.any_ran) {
      std::cerr << "stsa_gpu_bench: no case ran\n";
      return 2;
    }
    return outcome.any_failed ? 1 : 0;
  } catch (const std::exception& e) {  // stsa::Error, and bad_alloc or a JSON error too
    std::cerr << "stsa_gpu_bench: " << e.what() << "\n";
    return 2;
  }
}
