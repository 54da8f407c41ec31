// stsa_gpu_bench: times the CUDA backend on one video shape at several kept
// densities (spatial band masks with the frame-0 anchor; density >= 1 means the
// dense mask) and the GPU token permutation. CUDA events, warm-up, median of
// the timed runs; FLOPs from stsa/flops.hpp (TFLOP/s on kept tiles).
//
// For the PyTorch comparison (compare.py) it can read Q/K/V from raw bf16 files
// ([B, N, H, D], C order), export every plan's full and partial tile lists, and
// write sampled output rows, so both sides run on identical data and plans.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
  std::string inputs;       // directory with q.bin, k.bin, v.bin
  std::string export_dir;   // plan_<label>.bin/.json and o_<label>.f32 go here
  int sample_rows = 0;
  int warmup = 1;
  int repeats = 5;
  double budget_s = 20.0;   // per case: stop repeating once the timed runs took this long
  bool permutation = true;
  std::string json_path;
};

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw stsa::Error(stsa::detail::concat("CUDA error in ", what, ": ", cudaGetErrorString(status)));
}

// Times `enqueue` with CUDA events: `warmup` untimed runs, then up to `repeats`
// timed ones (fewer when they exceed the budget). Returns the sorted times in ms.
template <class Enqueue>
std::vector<double> time_ms(Enqueue&& enqueue, int warmup, int repeats, double budget_s) {
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < warmup; ++i) enqueue();
  check_cuda(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> times;
  double spent_ms = 0;
  for (int i = 0; i < repeats && spent_ms < budget_s * 1e3; ++i) {
    check_cuda(cudaEventRecord(start), "cudaEventRecord");
    enqueue();
    check_cuda(cudaEventRecord(stop), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "timed run");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms);
    spent_ms += ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times;
}

double median(const std::vector<double>& sorted) {
  if (sorted.empty()) return 0;
  const std::size_t n = sorted.size();
  return n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
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

void write_file(const std::string& path, const void* data, std::size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), std::streamsize(bytes));
  STSA_CHECK(out.good(), stsa::IoError, "cannot write ", path);
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
  std::ofstream out(path, std::ios::binary);
  json sections = json::array();
  std::int64_t offset = 0;
  const std::pair<const char*, const std::vector<std::int32_t>*> arrays[] = {
      {"full_offsets", &full_offsets}, {"full_tiles", &full}, {"partial_offsets", &partial_offsets},
      {"partial_tiles", &partial}};
  for (const auto& [name, array] : arrays) {
    out.write(reinterpret_cast<const char*>(array->data()), std::streamsize(array->size() * 4));
    sections.push_back({{"name", name}, {"offset", offset}, {"count", array->size()}});
    offset += std::int64_t(array->size() * 4);
  }
  STSA_CHECK(out.good(), stsa::IoError, "cannot write ", path);
  return {{"file", path}, {"dtype", "int32"}, {"sections", sections}};
}

json run(const Options& opt) {
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

  stsa::CudaBackend backend;
  json cases = json::array();
  for (const double density : opt.densities) {
    const std::string label = case_label(density);
    const stsa::MaskSpec spec = density >= 1.0 ? stsa::MaskSpec::dense()
                                               : stsa::mask_for_density(layout.grid, stsa::SparseKind::Spatial, density);
    const auto plan = stsa::TilePlan::build(layout.grid, spec);
    call.heads.assign(std::size_t(layout.heads), stsa::HeadMask{spec, spec.natural_order(), plan, true});
    const auto times = time_ms([&] { backend.run_async(call, nullptr); }, opt.warmup, opt.repeats, opt.budget_s);
    const double ms = median(times);
    const double kept_flops = stsa::kept_tile_flops(layout, *plan);
    const double exact_flops = stsa::attention_flops(plan->stats().kept_pairs, layout.head_dim) *
                               double(layout.batch * layout.heads);
    const auto& s = plan->stats();
    json record = {{"label", label},
                   {"density", density},
                   {"mask", spec.describe()},
                   {"band", spec.band},
                   {"anchor", spec.anchor},
                   {"kept_fraction", s.kept_fraction()},
                   {"tile_density", s.tile_density()},
                   {"tiles_full", s.tiles_full},
                   {"tiles_partial", s.tiles_partial},
                   {"tiles_empty", s.tiles_empty},
                   {"plan_build_ms", s.build_ms},
                   {"ms", ms},
                   {"ms_min", times.empty() ? 0.0 : times.front()},
                   {"runs", times.size()},
                   {"kept_tile_flops", kept_flops},
                   {"tflops_kept_tiles", kept_flops / (ms * 1e-3) / 1e12},
                   {"tflops_kept_pairs", exact_flops / (ms * 1e-3) / 1e12},
                   {"dense_flops", stsa::dense_attention_flops(layout)}};
    std::cerr << "  " << label << ": " << ms << " ms, " << record["tflops_kept_tiles"].get<double>()
              << " TFLOP/s on kept tiles (tile density " << s.tile_density() << ")\n";
    if (!opt.export_dir.empty()) {
      record["plan"] = export_plan(*plan, opt.export_dir + "/plan_" + label + ".bin");
      if (!sample.empty()) {
        // O rows of batch 0, all heads, as fp32 [rows, H, D].
        std::vector<std::uint16_t> all(elements);
        o.copy_to_host(all.data(), bytes);
        std::vector<float> rows;
        const std::int64_t row_elements = layout.heads * layout.head_dim;
        for (const std::int64_t r : sample)
          for (std::int64_t e = 0; e < row_elements; ++e) {
            const std::uint16_t bits = all[std::size_t(r * row_elements + e)];
            rows.push_back(dtype == stsa::DType::BF16 ? stsa::bf16_to_float(bits) : stsa::f16_to_float(bits));
          }
        const std::string path = opt.export_dir + "/o_" + label + ".f32";
        write_file(path, rows.data(), rows.size() * sizeof(float));
        record["sample_file"] = path;
      }
    }
    cases.push_back(record);
  }

  json result = {{"device", device.name},
                 {"multiprocessors", device.multiprocessors},
                 {"frames", opt.frames},
                 {"height", opt.height},
                 {"width", opt.width},
                 {"tokens", n},
                 {"batch", opt.batch},
                 {"heads", opt.heads},
                 {"head_dim", opt.head_dim},
                 {"dtype", opt.dtype},
                 {"sample_rows", sample},
                 {"cases", cases}};

  if (opt.permutation) {
    // Temporal heads: gather Q, K, V of every head into spatial-major order and
    // scatter O and LSE back, against a device-to-device copy of the same bytes.
    stsa::DeviceBuffer pq(bytes), pk(bytes), pv(bytes), po(bytes);
    stsa::DeviceBuffer plse(lse.bytes());
    std::vector<std::int64_t> all_heads(std::size_t(layout.heads));
    std::iota(all_heads.begin(), all_heads.end(), 0);
    const std::vector<stsa::TensorView> sources{call.q, call.k, call.v}, packed{view(pq), view(pk), view(pv)};
    const auto gather = time_ms(
        [&] {
          stsa::cuda_gather_heads(layout.grid, stsa::TokenOrder::FrameMajor, stsa::TokenOrder::SpatialMajor,
                                  all_heads, sources, packed);
        },
        opt.warmup, opt.repeats, opt.budget_s);
    const std::vector<stsa::TensorView> packed_o{view(po)}, dest_o{call.o};
    const auto packed_lse = stsa::LseView::contiguous(static_cast<float*>(plse.data()), layout.batch, layout.heads, n);
    const auto scatter = time_ms(
        [&] {
          stsa::cuda_scatter_heads(layout.grid, stsa::TokenOrder::SpatialMajor, stsa::TokenOrder::FrameMajor,
                                   all_heads, packed_o, dest_o, packed_lse, call.lse);
        },
        opt.warmup, opt.repeats, opt.budget_s);
    const auto copy = time_ms([&] { check_cuda(cudaMemcpyAsync(pq.data(), q.data(), bytes, cudaMemcpyDeviceToDevice),
                                               "cudaMemcpyAsync"); },
                              opt.warmup, opt.repeats, opt.budget_s);
    const double gather_bytes = stsa::permutation_bytes(layout, layout.heads, 3, stsa::element_size(dtype));
    const double scatter_bytes = stsa::permutation_bytes(layout, layout.heads, 1, stsa::element_size(dtype)) +
                                 2.0 * double(lse.bytes());
    const double copy_gbps = 2.0 * double(bytes) / (median(copy) * 1e-3) / 1e9;
    result["permutation"] = {{"gather_qkv_ms", median(gather)},
                             {"gather_gbps", gather_bytes / (median(gather) * 1e-3) / 1e9},
                             {"scatter_o_lse_ms", median(scatter)},
                             {"scatter_gbps", scatter_bytes / (median(scatter) * 1e-3) / 1e9},
                             {"copy_gbps", copy_gbps}};
    std::cerr << "  permutation: gather " << median(gather) << " ms, scatter " << median(scatter) << " ms, copy "
              << copy_gbps << " GB/s\n";
  }
  return result;
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
  app.add_option("--dtype", opt.dtype, "bf16 | fp16");
  app.add_option("--inputs", opt.inputs, "directory with q.bin, k.bin, v.bin (raw [B, N, H, D])");
  app.add_option("--export", opt.export_dir, "directory for plan lists and sampled output rows");
  app.add_option("--sample-rows", opt.sample_rows, "output rows to write per case (needs --export)");
  app.add_option("--warmup", opt.warmup);
  app.add_option("--repeats", opt.repeats);
  app.add_option("--budget-s", opt.budget_s, "seconds of timed runs per case at most");
  app.add_option("--permutation", opt.permutation, "also time the GPU permutation (true/false)");
  app.add_option("--json", opt.json_path, "write the results here (else stdout)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (stsa::cuda_device_count() == 0) {
      std::cerr << "stsa_gpu_bench: no CUDA device (" << stsa::cuda_unavailable_reason() << ")\n";
      return 2;
    }
    const json result = run(opt);
    if (opt.json_path.empty()) {
      std::cout << result.dump(2) << "\n";
    } else {
      std::ofstream out(opt.json_path);
      out << result.dump(2) << "\n";
      STSA_CHECK(out.good(), stsa::IoError, "cannot write ", opt.json_path);
    }
  } catch (const stsa::Error& e) {
    std::cerr << "stsa_gpu_bench: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
