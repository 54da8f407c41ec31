// What the benchmarks of `stsa bench` share (bench_shared.hpp).
#include "cli/bench_shared.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <random>
#include <string>
#include <thread>
#include <utility>

#include "bench/figures.hpp"
#include "bench/record.hpp"
#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "core/worker_threads.hpp"
#include "stsa/error.hpp"

namespace stsa::cli {

namespace {

constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// The n-th output (n >= 1) of splitmix64 started at `state0`: counter-based, so
// any stretch of the stream can be computed on its own.
std::uint64_t splitmix64(std::uint64_t state0, std::uint64_t n) {
  std::uint64_t z = state0 + n * kGolden;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

// splitmix64 + Box-Muller, element pair i from stream outputs 2i + 1 and 2i + 2,
// so the values do not depend on how the pairs are split over threads (a 1440p
// tensor is 464 million values: seconds on one core).
void fill_normal(const TensorView& t, std::uint64_t seed) {
  const std::uint64_t state0 = seed * kGolden + 0x632BE59BD9B4E019ull;
  const std::int64_t count = t.numel();  // contiguous: filled in storage order
  const std::int64_t pairs = (count + 1) / 2;
  const auto fill_pairs = [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t p = first; p < last; ++p) {
      const std::int64_t i = 2 * p;
      const double u1 = (double(splitmix64(state0, std::uint64_t(i) + 1) >> 11) + 1.0) * 0x1p-53;  // (0, 1]
      const double u2 = double(splitmix64(state0, std::uint64_t(i) + 2) >> 11) * 0x1p-53;
      const double r = std::sqrt(-2.0 * std::log(u1));
      store_from_float(t.data, t.dtype, i, float(r * std::cos(2.0 * M_PI * u2)));
      if (i + 1 < count) store_from_float(t.data, t.dtype, i + 1, float(r * std::sin(2.0 * M_PI * u2)));
    }
  };
  constexpr std::int64_t kPairsPerThread = 1 << 20;
  const auto threads = std::int64_t(std::clamp<std::int64_t>(pairs / kPairsPerThread, 1,
                                                              std::max(1u, std::thread::hardware_concurrency())));
  detail::run_shares(int(threads), [&](int w) { fill_pairs(pairs * w / threads, pairs * (w + 1) / threads); });
}

BenchSetup parse_bench_setup(const BenchArgs& args) {
  BenchSetup s;
  s.layout = VideoLayout{args.grid.grid(), args.batch, args.heads, args.head_dim};
  s.layout.validate();
  s.kv_heads = args.kv_heads == 0 ? args.heads : args.kv_heads;
  STSA_CHECK(s.kv_heads >= 1 && s.kv_heads <= args.heads && args.heads % s.kv_heads == 0, InvalidArgument,
             "--kv-heads must divide --heads (", args.heads, "), got ", args.kv_heads);
  s.dtype = parse_dtype(args.dtype);
  s.alignment = parse_alignment(args.align);
  s.tile = TileShape{args.tile, args.tile};
  s.tile.validate();
  STSA_CHECK(args.repeats >= 1 && args.repeats <= 1000, InvalidArgument, "--repeats must be in [1, 1000], got ",
             args.repeats);
  STSA_CHECK(args.check_rows >= 0, InvalidArgument, "--check-rows must be >= 0, got ", args.check_rows);
  STSA_CHECK(args.max_tflop > 0, InvalidArgument, "--max-tflop must be > 0, got ", args.max_tflop);
  return s;
}

BenchOptions parse_bench_options(const BenchArgs& args) {
  BenchOptions o{parse_bench_setup(args)};
  o.spec = mask_by_name(o.layout.grid, args.mask, args.density);
  return o;
}

int hardware_threads() { return int(std::max(1u, std::thread::hardware_concurrency())); }

const char* peak_units_text(std::string_view units) {
  if (units == "amx") return "AMX bf16 tile";
  if (units == "bf16_dot") return "VDPBF16PS bf16 dot";
  return "FMA";
}

void check_bench_memory(const BenchOptions& o) {
  const VideoLayout& l = o.layout;
  const double values = double(l.batch) * double(l.tokens()) * double(l.heads) * double(l.head_dim);
  const double kv_values = values / double(l.heads) * double(o.kv_heads);
  // Q, K, V at the input dtype; the two outputs at theirs (bf16 for fp8 inputs); two fp32 LSE.
  const double bytes = (values + 2.0 * kv_values) * double(element_size(o.dtype)) +
                       2.0 * values * double(element_size(default_output_dtype(o.dtype))) +
                       2.0 * double(l.batch) * double(l.heads) * double(l.tokens()) * double(sizeof(float));
  const double memory = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  STSA_CHECK(memory <= 0 || bytes < 0.5 * memory, ResourceError, "the benchmark tensors need ", bytes / 1e9,
             " GB, more than half of this machine's ", memory / 1e9, " GB");
}

void check_bench_work(const BenchArgs& args, double tflop, const std::string& what) {
  STSA_CHECK(tflop <= args.max_tflop, InvalidArgument, "the benchmark would do ", tflop, " TFLOP (", what,
             "), more than --max-tflop ", args.max_tflop, ": check the shape, or raise --max-tflop to run it");
}

BenchCase::BenchCase(const BenchOptions& o, std::uint64_t seed, std::shared_ptr<const TilePlan> sparse_plan) {
  check_bench_memory(o);
  const VideoLayout& l = o.layout;
  const std::int64_t n = l.tokens();

  // Temporal heads run in spatial-major order: random inputs are simply taken as already permuted.
  plan = sparse_plan ? std::move(sparse_plan) : TilePlan::build(l.grid, o.spec, o.tile, o.alignment);
  dense_plan = TilePlan::build(l.grid, MaskSpec::dense(), o.tile, Alignment::Exact);
  q = Tensor(o.dtype, l.batch, n, l.heads, l.head_dim);
  for (Tensor* t : {&k, &v}) *t = Tensor(o.dtype, l.batch, n, o.kv_heads, l.head_dim);
  for (Tensor* t : {&o_dense, &o_sparse}) *t = Tensor(default_output_dtype(o.dtype), l.batch, n, l.heads, l.head_dim);
  lse_dense = LseBuffer(l.batch, l.heads, n);
  lse_sparse = LseBuffer(l.batch, l.heads, n);
  fill_normal(q.view(), seed * 3 + 1);
  fill_normal(k.view(), seed * 3 + 2);
  fill_normal(v.view(), seed * 3 + 3);

  dense.layout = l;
  dense.q = q.view();
  dense.k = k.view();
  dense.v = v.view();
  dense.o = o_dense.view();
  dense.lse = lse_dense.view();
  dense.heads.assign(std::size_t(l.heads), HeadMask{MaskSpec::dense(), TokenOrder::FrameMajor, dense_plan, true});
  sparse = dense;
  sparse.o = o_sparse.view();
  sparse.lse = lse_sparse.view();
  sparse.heads.assign(std::size_t(l.heads), HeadMask{o.spec, o.spec.natural_order(), plan, true});
}

Errors check_rows(const AttentionCall& call, const std::vector<std::int64_t>& rows, const PairPredicate& computes) {
  // The reference is single-threaded plain loops; its rows are independent, so
  // groups of rows run on their own threads (a 720p row is 0.6 GFLOP of fp64).
  const auto count = std::int64_t(rows.size());
  const auto groups = std::int64_t(std::clamp<std::int64_t>(count, 1, std::max(1u, std::thread::hardware_concurrency())));
  const auto group_count = std::size_t(groups);
  std::vector<std::vector<double>> group_o(group_count), group_lse(group_count);
  const auto group_rows = [&](std::int64_t g) {
    return std::vector<std::int64_t>(rows.begin() + count * g / groups, rows.begin() + count * (g + 1) / groups);
  };
  {
    // An error on a worker (out of memory) is rethrown here, not left to end the process.
    std::vector<std::exception_ptr> errors(group_count);
    detail::run_shares(int(groups), [&](int g) {
      try {
        reference_rows(call, group_rows(g), group_o[std::size_t(g)], group_lse[std::size_t(g)], computes);
      } catch (...) {
        errors[std::size_t(g)] = std::current_exception();
      }
    });
    for (const std::exception_ptr& error : errors)
      if (error) std::rethrow_exception(error);
  }
  const VideoLayout& layout = call.layout;
  const std::int64_t dims = layout.head_dim;
  // Where row r's reference is: its group, its index there, the group's size
  // (arrays [B, rows, H, D] and [B, H, rows] over the group's rows).
  struct Place {
    std::size_t group;
    std::int64_t index, rows;
  };
  std::vector<Place> places;
  for (std::int64_t g = 0; g < groups; ++g) {
    const std::int64_t first = count * g / groups, last = count * (g + 1) / groups;
    for (std::int64_t r = first; r < last; ++r) places.push_back({std::size_t(g), r - first, last - first});
  }
  Errors e;
  double err2 = 0, ref2 = 0;
  for (std::int64_t b = 0; b < layout.batch; ++b)
    for (std::int64_t r = 0; r < count; ++r)
      for (std::int64_t h = 0; h < layout.heads; ++h) {
        const std::int64_t i = rows[std::size_t(r)];
        const Place& at = places[std::size_t(r)];
        const std::vector<double>& ref_o = group_o[at.group];
        const std::vector<double>& ref_lse = group_lse[at.group];
        for (std::int64_t d = 0; d < dims; ++d) {
          const double ref = ref_o[std::size_t(((b * at.rows + at.index) * layout.heads + h) * dims + d)];
          const double diff = std::abs(double(call.o.load(b, i, h, d)) - ref);
          // NaN anywhere makes the error NaN, which the report shows as such.
          e.max_abs = std::isnan(diff) || diff > e.max_abs ? diff : e.max_abs;
          err2 += diff * diff;
          ref2 += ref * ref;
        }
        const double ref_l = ref_lse[std::size_t((b * layout.heads + h) * at.rows + at.index)];
        const double got_l = call.lse.at(b, h, i);
        const double diff = ref_l == got_l ? 0.0 : std::abs(got_l - ref_l);
        e.lse_max_abs = std::isnan(diff) || diff > e.lse_max_abs ? diff : e.lse_max_abs;
      }
  e.rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  return e;
}

std::vector<std::int64_t> sample_rows(std::int64_t tokens, int count, std::uint64_t seed) {
  std::vector<std::int64_t> rows;
  if (count >= tokens) {
    for (std::int64_t i = 0; i < tokens; ++i) rows.push_back(i);
    return rows;
  }
  std::mt19937_64 rng(seed ^ 0x5DEECE66Dull);
  std::uniform_int_distribution<std::int64_t> pick(0, tokens - 1);
  while (std::int64_t(rows.size()) < count) {
    const std::int64_t i = pick(rng);
    if (std::find(rows.begin(), rows.end(), i) == rows.end()) rows.push_back(i);
  }
  std::sort(rows.begin(), rows.end());
  return rows;
}

BenchErrors check_dense_and_sparse(const AttentionCall& dense, const AttentionCall& sparse,
                                   const std::shared_ptr<const TilePlan>& plan, int count, std::uint64_t seed,
                                   bool progress) {
  BenchErrors e;
  const auto rows = sample_rows(dense.layout.tokens(), count, seed);
  e.rows = std::int64_t(rows.size());
  if (rows.empty()) return e;
  Progress p("checking against the fp64 reference", progress);
  p.update(0.0);
  PairPredicate computes;
  if (plan->alignment() == Alignment::Round)
    computes = [&plan](std::int64_t, std::int64_t qp, std::int64_t kp) { return plan->computes(qp, kp); };
  e.sparse = check_rows(sparse, rows, computes);
  p.update(0.5);
  e.dense = check_rows(dense, rows, {});
  p.update(1.0);
  return e;
}

nlohmann::json bench_case_record(const BenchArgs& args, const BenchOptions& options, const TilePlan& plan,
                                 const BenchErrors& errors) {
  const VideoLayout& layout = options.layout;
  const VideoGrid& grid = layout.grid;
  const PlanStats& stats = plan.stats();
  const bench::AttentionWork work = bench::attention_work(layout, plan);
  nlohmann::json record = {
      {"command", "bench"},
      {"grid", grid.describe()},
      {"frames", grid.frames},
      {"height", grid.height},
      {"width", grid.width},
      {"text", grid.text_tokens},
      {"text_placement", std::string(to_string(grid.text_placement))},
      {"tokens", layout.tokens()},
      {"batch", layout.batch},
      {"heads", layout.heads},
      {"kv_heads", options.kv_heads},
      {"head_dim", layout.head_dim},
      {"mask_kind", args.mask},
      {"mask", options.spec.describe()},
      {"density", args.density},
      {"dtype", std::string(to_string(options.dtype))},
      {"out_dtype", std::string(to_string(default_output_dtype(options.dtype)))},
      {"align", std::string(to_string(plan.alignment()))},
      {"tile", args.tile},
      {"repeats", args.repeats},
      {"warmup", 1},
      {"check_rows", errors.rows},
      {"seed", args.seed},
      {"changed_pairs", stats.changed_pairs},
      // The work the kept tiles save, ragged last tiles by their area as in the FLOP counts (null: none kept).
      {"ideal_speedup", bench::json_number(work.dense_flops / work.kept_tile_flops)},
      {"dense_flops", work.dense_flops},
      {"kept_tile_flops", work.kept_tile_flops},
      {"rel_l2_err", bench::json_number(errors.sparse.rel_l2)},
      {"max_abs_err", bench::json_number(errors.sparse.max_abs)},
      {"lse_max_abs_err", bench::json_number(errors.sparse.lse_max_abs)},
      {"dense_rel_l2_err", bench::json_number(errors.dense.rel_l2)},
      {"dense_max_abs_err", bench::json_number(errors.dense.max_abs)},
      {"dense_lse_max_abs_err", bench::json_number(errors.dense.lse_max_abs)},
  };
  bench::add_plan_stats(record, stats);
  return record;
}

}  // namespace stsa::cli
