// `stsa bench --dist`, run under mpirun: the Ulysses call over MPI against the
// single-process call on the same inputs, with the bytes each rank moved.
//
// Every rank generates the same inputs (a hash of seed and element index, so a
// rank only generates its own shard), runs the distributed call, and sends its
// outputs to rank 0, which also runs the single-process call, compares, and
// prints. Errors that every rank reaches alike (bad options, collective
// validation) are printed once by rank 0; every rank exits 2. A timeout (a rank
// missing) aborts the whole job.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "bench/figures.hpp"
#include "bench/timing_loop.hpp"
#include "cli/bench_shared.hpp"
#include "cli/commands.hpp"
#include "cli/json_text.hpp"
#include "cli/options.hpp"
#include "stsa/cpu.hpp"
#include "stsa/dist.hpp"
#include "stsa/error.hpp"
#include "stsa/flops.hpp"
#include "stsa/reference.hpp"
#include "stsa/routed.hpp"

namespace stsa::cli {
namespace {

using Json = nlohmann::ordered_json;

// ---- Inputs: N(0, 1) per element from a hash of (seed, tensor, b, global token, head, channel).

std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Fills `t` with the values of global tokens [first, first + t.tokens()) of tensor `which`.
void fill_tokens(const TensorView& t, std::uint64_t seed, int which, std::int64_t first, std::int64_t heads) {
  for (std::int64_t b = 0; b < t.batch(); ++b)
    for (std::int64_t n = 0; n < t.tokens(); ++n)
      for (std::int64_t h = 0; h < t.heads(); ++h)
        for (std::int64_t d = 0; d < t.head_dim(); ++d) {
          const std::uint64_t index = std::uint64_t(((b * 0x100000000ll + first + n) * heads + h) * t.head_dim() + d);
          const std::uint64_t r = mix(mix(seed * 4 + std::uint64_t(which)) ^ index);
          const double u1 = (double(r >> 11) + 0.5) * 0x1p-53, u2 = double(mix(r) >> 11) * 0x1p-53;
          t.store(b, n, h, d, float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2)));
        }
}

// Tokens [first, first + count) of the whole sequence as a tensor of their own, with
// `heads` heads (the layout's, or K and V's fewer for grouped-query attention).
Tensor make_tokens(const VideoLayout& l, std::int64_t heads, DType dtype, std::uint64_t seed, int which,
                   std::int64_t first, std::int64_t count) {
  Tensor t(dtype, l.batch, count, heads, l.head_dim);
  fill_tokens(t.view(), seed, which, first, heads);
  return t;
}

// A [B, 0, heads, D] view for a rank that holds no video tokens.
TensorView empty_view(DType dtype, const VideoLayout& l, std::int64_t heads) {
  TensorView v;
  v.dtype = dtype;
  v.shape = {l.batch, 0, heads, l.head_dim};
  v.stride = {0, heads * l.head_dim, l.head_dim, 1};
  return v;
}

// Wall time of one distributed call as its slowest rank saw it: the ranks line
// up at a barrier before each run, and the run's time and its phase times from
// `report` (agree, scatter, local, gather) are the maxima over ranks.
class SlowestRankStopwatch final : public bench::Stopwatch {
 public:
  SlowestRankStopwatch(dist::Communicator& comm, const dist::UlyssesReport& report) : comm_(comm), report_(report) {}
  void start() override {
    comm_.barrier();
    wall_.start();
  }
  double stop_ms() override {
    double times[5] = {wall_.stop_ms(), report_.agree_ms, report_.scatter_ms, report_.local_ms, report_.gather_ms};
    comm_.allreduce(times, dist::ReduceOp::Max);
    for (std::size_t p = 0; p < phases_.size(); ++p) phases_[p].ms.push_back(times[p + 1]);
    return times[0];
  }
  const std::array<bench::Samples, 4>& phases() const { return phases_; }

 private:
  dist::Communicator& comm_;
  const dist::UlyssesReport& report_;
  bench::WallStopwatch wall_;
  std::array<bench::Samples, 4> phases_;
};

// Ranks on this machine (OpenMPI tells each process), so that ranks share the cores instead of oversubscribing them.
int local_ranks(int ranks) {
  if (const char* text = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) {
    const int n = std::atoi(text);
    if (n >= 1) return n;
  }
  return ranks;
}

struct Settings : BenchSetup {
  std::vector<MaskSpec> masks{};  // empty when routed
  std::vector<MaskSpec> all_temporal{};  // every head temporal, for permutation_bytes_if_sharded_all_temporal
  std::optional<Router> router{};
  Isa isa = Isa::Auto;
  int rank_threads = 1, single_threads = 1;
};

// Everything is checked here, before any allocation; every rank reaches the same verdict.
Settings parse(const BenchArgs& args, int ranks) {
  Settings s{parse_bench_setup(args)};
  s.isa = parse_isa(args.isa);
  STSA_CHECK(args.threads >= 0, InvalidArgument, "--threads must be >= 0, got ", args.threads);
  dist::heads_per_rank(args.heads, ranks);  // says which rank counts would work
  STSA_CHECK(s.kv_heads % ranks == 0, InvalidArgument, "Ulysses splits K/V heads over ranks too: --kv-heads ",
             s.kv_heads, " cannot be split over ", ranks, " ranks");
  if (args.mask == "routed") {
    RouterOptions options;
    options.spatial_density = options.temporal_density = options.frame_window_density = args.density;
    options.seed = args.seed;
    options.validate();
    s.router.emplace(options);
  } else if (args.mask == "mixed") {  // alternate spatial and temporal heads
    const MaskSpec spatial = mask_by_name(s.layout.grid, "spatial", args.density);
    const MaskSpec temporal = mask_by_name(s.layout.grid, "temporal", args.density);
    for (std::int64_t h = 0; h < args.heads; ++h) s.masks.push_back(h % 2 == 0 ? spatial : temporal);
  } else {
    s.masks.push_back(mask_by_name(s.layout.grid, args.mask, args.density));
  }
  s.all_temporal.push_back(mask_by_name(s.layout.grid, "temporal", args.density));
  const int per_rank = std::max(1, hardware_threads() / std::min(local_ranks(ranks), hardware_threads()));
  s.rank_threads = args.threads > 0 ? args.threads : per_rank;
  s.single_threads = args.threads > 0 ? args.threads : hardware_threads();
  return s;
}

// Per-rank figures rank 0 prints, gathered as doubles.
struct RankFigures {
  double bytes_sent, bytes_received, control_bytes_sent, local_bytes, expected_exact;
  double agree_ms, scatter_ms, local_ms, gather_ms, shard_tokens;
};

Json run(dist::Communicator& comm, const BenchArgs& args) {
  const int ranks = comm.size(), rank = comm.rank();
  const bool lead = rank == 0;
  Settings s = parse(args, ranks);
  const VideoLayout& l = s.layout;
  const VideoGrid& g = l.grid;
  // O as the one-process benchmark has it: the input dtype, bf16 for fp8.
  const DType out_dtype = default_output_dtype(s.dtype);
  PlanCache plans;  // the masks' plans: built for the work estimate, then used by the calls
  {
    // The work of the warm-up and timed calls, distributed and single-process: every
    // head's kept tiles (routed: dense, which the router may choose for any head).
    // First from the masks' kept pairs (closed form, about the tiles' work): an absurd
    // shape's plans would take long to build.
    const int calls = 1 + args.repeats;
    const std::string what = "of the distributed and the single-process call, " + std::to_string(calls) + " calls each";
    double pair_flops = 0, tile_flops = 0;
    if (s.router) {
      pair_flops = tile_flops = dense_attention_flops(l);
    } else {
      const auto head_spec = [&](std::int64_t h) -> const MaskSpec& {
        return s.masks[s.masks.size() == 1 ? 0 : std::size_t(h)];
      };
      for (std::int64_t h = 0; h < l.heads; ++h)
        pair_flops += double(l.batch) * attention_flops(kept_pairs(g, head_spec(h)), l.head_dim);
      check_bench_work(args, 2.0 * calls * pair_flops / 1e12, "the kept pairs " + what);
      const VideoLayout one_head{g, l.batch, 1, l.head_dim};
      for (std::int64_t h = 0; h < l.heads; ++h)
        tile_flops += kept_tile_flops(one_head, *plans.get(g, head_spec(h), s.tile, s.alignment));
    }
    check_bench_work(args, 2.0 * calls * tile_flops / 1e12, "the kept tiles " + what);
  }
  const dist::Shard shard = dist::sequence_shard(g.video_tokens(), ranks, rank);
  const std::int64_t text_begin = g.text_placement == TextPlacement::Before ? 0 : g.video_end();

  // ---- The distributed call on this rank's shard.
  std::optional<Tensor> q, k, v, o;
  std::optional<LseBuffer> lse;
  if (shard.count > 0) {
    q = make_tokens(l, l.heads, s.dtype, args.seed, 0, g.video_begin() + shard.begin, shard.count);
    k = make_tokens(l, s.kv_heads, s.dtype, args.seed, 1, g.video_begin() + shard.begin, shard.count);
    v = make_tokens(l, s.kv_heads, s.dtype, args.seed, 2, g.video_begin() + shard.begin, shard.count);
    o = Tensor(out_dtype, l.batch, shard.count, l.heads, l.head_dim);
    lse = LseBuffer(l.batch, l.heads, shard.count);
  }
  std::optional<Tensor> text_q, text_k, text_v, text_o;
  std::optional<LseBuffer> text_lse;
  dist::UlyssesCall call;
  call.layout = l;
  call.q = q ? q->view() : empty_view(s.dtype, l, l.heads);
  call.k = k ? k->view() : empty_view(s.dtype, l, s.kv_heads);
  call.v = v ? v->view() : empty_view(s.dtype, l, s.kv_heads);
  call.o = o ? o->view() : empty_view(out_dtype, l, l.heads);
  if (lse) {
    call.lse = lse->view();
  } else {  // no tokens here, but LSE is wanted like on every other rank
    static float unused;
    call.lse.data = &unused;
    call.lse.shape = {l.batch, l.heads, 0};
  }
  if (g.text_tokens > 0) {
    text_q = make_tokens(l, l.heads, s.dtype, args.seed, 0, text_begin, g.text_tokens);
    text_k = make_tokens(l, s.kv_heads, s.dtype, args.seed, 1, text_begin, g.text_tokens);
    text_v = make_tokens(l, s.kv_heads, s.dtype, args.seed, 2, text_begin, g.text_tokens);
    text_o = Tensor(out_dtype, l.batch, g.text_tokens, l.heads, l.head_dim);
    text_lse = LseBuffer(l.batch, l.heads, g.text_tokens);
    call.text_q = text_q->view();
    call.text_k = text_k->view();
    call.text_v = text_v->view();
    call.text_o = text_o->view();
    call.text_lse = text_lse->view();
  }
  call.masks = s.masks;
  call.router = s.router ? &*s.router : nullptr;
  call.tile = s.tile;
  call.alignment = s.alignment;

  const auto rank_backend = make_cpu_backend(CpuOptions{s.isa, s.rank_threads});
  dist::UlyssesWorkspace workspace;  // kept across calls, as a serving loop would
  // One warm-up (plans, workspace pages, caches), then a fixed count of runs: every
  // rank must make the same number of collective calls, so no time budget here.
  dist::UlyssesReport report;
  SlowestRankStopwatch slowest(comm, report);
  bench::Stopwatch* dist_clocks[] = {&slowest};
  const bench::TimedRuns dist_t = bench::time_runs(
      {.warmup = 1, .repeats = args.repeats},
      [&] { report = dist::ulysses_attention(comm, call, *rank_backend, plans, workspace); }, dist_clocks);
  const auto& phase_ms = slowest.phases();

  // ---- Per-rank figures and outputs to rank 0 (after timing: not part of the call's traffic).
  const bool with_lse = true;
  RankFigures figures{double(report.total.bytes_sent),
                      double(report.total.bytes_received),
                      double(report.total.control_bytes_sent),
                      double(report.local.bytes_sent + report.local.control_bytes_sent),
                      double(dist::ulysses_volume(l, s.dtype, out_dtype, with_lse, ranks, rank, s.kv_heads).sent()),
                      phase_ms[0].median_ms(),
                      phase_ms[1].median_ms(),
                      phase_ms[2].median_ms(),
                      phase_ms[3].median_ms(),
                      double(shard.count)};
  std::vector<RankFigures> all(static_cast<std::size_t>(ranks));
  comm.allgather(&figures, sizeof figures, all.data());

  const std::int64_t o_row = l.head_dim * std::int64_t(element_size(out_dtype));
  std::vector<std::int64_t> send_counts(std::size_t(ranks), 0), send_offsets(std::size_t(ranks), 0);
  std::vector<std::int64_t> recv_counts(std::size_t(ranks), 0), recv_offsets(std::size_t(ranks), 0);
  const std::int64_t my_bytes = l.batch * shard.count * l.heads * (o_row + 4);
  send_counts[0] = my_bytes;
  std::vector<std::byte> send(static_cast<std::size_t>(my_bytes)), gathered;
  if (shard.count > 0) {
    std::memcpy(send.data(), o->view().data, std::size_t(l.batch * shard.count * l.heads * o_row));
    std::memcpy(send.data() + l.batch * shard.count * l.heads * o_row, lse->view().data,
                std::size_t(l.batch * shard.count * l.heads * 4));
  }
  if (lead) {
    std::int64_t total = 0;
    for (int r = 0; r < ranks; ++r) {
      recv_offsets[std::size_t(r)] = total;
      recv_counts[std::size_t(r)] = l.batch * dist::sequence_shard(g.video_tokens(), ranks, r).count * l.heads * (o_row + 4);
      total += recv_counts[std::size_t(r)];
    }
    gathered.resize(std::size_t(total));
  }
  comm.alltoallv(send.data(), send_counts, send_offsets, gathered.data(), recv_counts, recv_offsets);

  // ---- The single-process call on rank 0, while the other ranks wait.
  const auto default_timeout = comm.timeout();
  comm.set_timeout(std::max(default_timeout, std::chrono::milliseconds(std::chrono::hours(1))));
  Json out;
  if (lead) {
    Tensor fq = make_tokens(l, l.heads, s.dtype, args.seed, 0, 0, g.tokens());
    Tensor fk = make_tokens(l, s.kv_heads, s.dtype, args.seed, 1, 0, g.tokens());
    Tensor fv = make_tokens(l, s.kv_heads, s.dtype, args.seed, 2, 0, g.tokens());
    Tensor fo(out_dtype, l.batch, g.tokens(), l.heads, l.head_dim);
    LseBuffer flse(l.batch, l.heads, g.tokens());
    const RoutedCall single{l, fq.view(), fk.view(), fv.view(), fo.view(), flse.view()};
    const auto single_backend = make_cpu_backend(CpuOptions{s.isa, s.single_threads});
    const RoutedOptions options{s.tile, s.alignment};
    const auto run_single = [&] {
      return s.router ? routed_attention(*single_backend, plans, single, *s.router, options)
                      : run_routed(*single_backend, plans, single, dist::routes_for_masks(s.masks, l.heads), options);
    };
    RoutedResult decided;
    bench::WallStopwatch wall;
    bench::Stopwatch* single_clocks[] = {&wall};
    const bench::TimedRuns single_t = bench::time_runs(
        {.warmup = 1, .repeats = args.repeats}, [&] { decided = run_single(); }, single_clocks);

    // Compare: video rows from the gathered shards, text rows from rank 0's replicated text output.
    double max_diff = 0, max_lse_diff = 0;
    std::int64_t differing = 0;
    const auto note = [&](float a, float b, double& worst) {
      if (std::memcmp(&a, &b, sizeof a) != 0) ++differing;
      const double d = (std::isnan(a) || std::isnan(b)) ? INFINITY : a == b ? 0.0 : std::abs(double(a) - double(b));
      worst = std::max(worst, d);
    };
    const TensorView full = fo.view();
    const LseView full_lse = flse.view();
    for (int r = 0; r < ranks; ++r) {
      const dist::Shard sh = dist::sequence_shard(g.video_tokens(), ranks, r);
      if (sh.count == 0) continue;
      auto* base = gathered.data() + recv_offsets[std::size_t(r)];
      const TensorView part = TensorView::contiguous(base, out_dtype, l.batch, sh.count, l.heads, l.head_dim,
                                                     MemoryLayout::BNHD);
      const auto* part_lse = reinterpret_cast<const float*>(base + l.batch * sh.count * l.heads * o_row);
      for (std::int64_t b = 0; b < l.batch; ++b)
        for (std::int64_t i = 0; i < sh.count; ++i)
          for (std::int64_t h = 0; h < l.heads; ++h) {
            const std::int64_t n = g.video_begin() + sh.begin + i;
            for (std::int64_t d = 0; d < l.head_dim; ++d) note(part.load(b, i, h, d), full.load(b, n, h, d), max_diff);
            float x;
            std::memcpy(&x, part_lse + (b * l.heads + h) * sh.count + i, sizeof x);
            note(x, full_lse.at(b, h, n), max_lse_diff);
          }
    }
    for (std::int64_t b = 0; b < l.batch; ++b)
      for (std::int64_t j = 0; j < g.text_tokens; ++j)
        for (std::int64_t h = 0; h < l.heads; ++h) {
          for (std::int64_t d = 0; d < l.head_dim; ++d)
            note(text_o->view().load(b, j, h, d), full.load(b, text_begin + j, h, d), max_diff);
          note(text_lse->view().at(b, h, j), full_lse.at(b, h, text_begin + j), max_lse_diff);
        }

    // The fp64 reference on rows spread over the whole sequence (the distributed rows equal these bits or not).
    double max_ref_err = 0;
    std::vector<std::int64_t> rows;
    const std::int64_t wanted = std::min<std::int64_t>(args.check_rows, g.tokens());
    for (std::int64_t i = 0; i < wanted; ++i) rows.push_back(i * g.tokens() / wanted);
    if (!rows.empty()) {
      AttentionCall ref{l, fq.view(), fk.view(), fv.view(), fo.view(), {}, {}, 0.f};
      std::vector<std::shared_ptr<const TilePlan>> head_plans;
      for (const HeadRoute& route : decided.heads) {
        ref.heads.push_back(HeadMask{route.spec, TokenOrder::FrameMajor, nullptr, true});
        head_plans.push_back(plans.get(g, route.spec, s.tile, s.alignment));
      }
      // A rounded plan computes whole tiles, not the mask: the pairs it computes, in its own token order.
      PairPredicate computes;
      if (s.alignment == Alignment::Round)
        computes = [&](std::int64_t h, std::int64_t qp, std::int64_t kp) {
          const TilePlan& plan = *head_plans[std::size_t(h)];
          const auto in_plan = [&](std::int64_t p) {
            return g.position(g.coord(p, TokenOrder::FrameMajor), plan.order());
          };
          return plan.computes(in_plan(qp), in_plan(kp));
        };
      std::vector<double> o64, lse64;
      reference_rows(ref, rows, o64, lse64, computes);
      const std::int64_t count = std::int64_t(rows.size());
      for (std::int64_t b = 0; b < l.batch; ++b)
        for (std::int64_t r = 0; r < count; ++r)
          for (std::int64_t h = 0; h < l.heads; ++h)
            for (std::int64_t d = 0; d < l.head_dim; ++d) {
              const double e = std::abs(double(full.load(b, rows[std::size_t(r)], h, d)) -
                                        o64[std::size_t(((b * count + r) * l.heads + h) * l.head_dim + d)]);
              if (std::isnan(e) || e > max_ref_err) max_ref_err = e;  // a NaN stays: std::max would drop it
            }
    }

    std::int64_t temporal = 0;
    Json routes = Json::array();
    std::vector<MaskSpec> decided_masks;
    for (const HeadRoute& route : decided.heads) {
      routes.push_back(std::string(to_string(route.route)));
      decided_masks.push_back(route.spec);
      temporal += route.spec.natural_order() == TokenOrder::SpatialMajor ? 1 : 0;
    }
    double bytes_sent = 0, bytes_received = 0, control = 0, local_bytes = 0, sharded = 0, sharded_all = 0;
    Json sent_by_rank = Json::array(), exact_by_rank = Json::array(), shard_tokens = Json::array();
    for (int r = 0; r < ranks; ++r) {
      const RankFigures& f = all[std::size_t(r)];
      bytes_sent = std::max(bytes_sent, f.bytes_sent);
      bytes_received = std::max(bytes_received, f.bytes_received);
      control = std::max(control, f.control_bytes_sent);
      local_bytes = std::max(local_bytes, f.local_bytes);
      sharded = std::max(sharded, double(dist::sharded_permutation_bytes(l, decided_masks, s.dtype, out_dtype, with_lse, ranks, r)));
      sharded_all = std::max(sharded_all, double(dist::sharded_permutation_bytes(l, s.all_temporal, s.dtype,
                                                                                 out_dtype, with_lse, ranks, r)));
      sent_by_rank.push_back(std::int64_t(f.bytes_sent));
      exact_by_rank.push_back(std::int64_t(f.expected_exact));
      shard_tokens.push_back(std::int64_t(f.shard_tokens));
    }
    const double formula = dist::ulysses_formula_bytes(l, s.dtype, out_dtype, with_lse, ranks, s.kv_heads);
    const double dist_median = dist_t[0].median_ms(), single_median = single_t[0].median_ms();
    out["command"] = "bench --dist";
    out["ranks"] = ranks;
    out["heads_per_rank"] = l.heads / ranks;
    out["layout"] = {{"frames", g.frames}, {"height", g.height}, {"width", g.width}, {"text", g.text_tokens},
                     {"text_placement", std::string(to_string(g.text_placement))}, {"batch", l.batch},
                     {"heads", l.heads}, {"kv_heads", s.kv_heads}, {"head_dim", l.head_dim},
                     {"tokens", g.tokens()}};
    out["dtype"] = std::string(to_string(s.dtype));
    out["out_dtype"] = std::string(to_string(out_dtype));
    out["mask"] = args.mask;
    out["density"] = args.density;
    out["routes"] = routes;
    out["temporal_heads"] = temporal;
    out["backend"] = "cpu";
    out["threads_per_rank"] = s.rank_threads;
    out["single_threads"] = s.single_threads;
    out["shard_tokens"] = shard_tokens;
    out["max_abs_diff_vs_single"] = max_diff;
    out["max_lse_diff_vs_single"] = max_lse_diff;
    out["bit_identical_vs_single"] = differing == 0;
    out["reference_rows"] = std::int64_t(rows.size());
    out["max_abs_err_vs_reference"] = max_ref_err;
    out["bytes_sent_per_rank"] = std::int64_t(bytes_sent);
    out["bytes_received_per_rank"] = std::int64_t(bytes_received);
    out["bytes_sent_by_rank"] = sent_by_rank;
    out["control_bytes_sent_per_rank"] = std::int64_t(control);
    out["expected_ulysses_bytes_per_rank"] = formula;
    out["expected_exact_bytes_by_rank"] = exact_by_rank;
    out["bytes_vs_expected"] = formula > 0 ? bytes_sent / formula : (bytes_sent == 0 ? 1.0 : INFINITY);
    out["permutation_extra_bytes"] = std::int64_t(local_bytes);
    out["permutation_bytes_if_sharded"] = std::int64_t(sharded);
    out["permutation_bytes_if_sharded_all_temporal"] = std::int64_t(sharded_all);
    out["dist_ms"] = dist_median;
    out["single_ms"] = single_median;
    out["speedup_vs_single"] = bench::speedup(single_median, dist_median);
    out["phases_ms"] = {{"agree", phase_ms[0].median_ms()}, {"scatter", phase_ms[1].median_ms()},
                        {"local", phase_ms[2].median_ms()}, {"gather", phase_ms[3].median_ms()}};
    out["repeats"] = args.repeats;
    out["seed"] = args.seed;
    out["warmup"] = 1;
    out["dist_ms_min"] = dist_t[0].min_ms();
    out["dist_ms_max"] = dist_t[0].max_ms();
    out["dist_ms_runs"] = dist_t[0].ms;
    out["single_ms_min"] = single_t[0].min_ms();
    out["single_ms_max"] = single_t[0].max_ms();
    out["single_ms_runs"] = single_t[0].ms;
  }
  comm.barrier();  // the others wait here for rank 0's single-process run
  comm.set_timeout(default_timeout);
  return out;
}

void print_text(const Json& j) {
  const auto& l = j["layout"];
  const std::string dtype = j["dtype"].get<std::string>(), out_dtype = j["out_dtype"].get<std::string>();
  std::printf("stsa bench --dist: %d ranks x %lld heads, grid %lldx%lldx%lld (+%lld text), B=%lld H=%lld D=%lld %s, %s masks at %.2f\n",
              j["ranks"].get<int>(), (long long)j["heads_per_rank"].get<std::int64_t>(),
              (long long)l["frames"].get<std::int64_t>(), (long long)l["height"].get<std::int64_t>(),
              (long long)l["width"].get<std::int64_t>(), (long long)l["text"].get<std::int64_t>(),
              (long long)l["batch"].get<std::int64_t>(), (long long)l["heads"].get<std::int64_t>(),
              (long long)l["head_dim"].get<std::int64_t>(),
              (dtype == out_dtype ? dtype : dtype + " in, " + out_dtype + " out").c_str(),
              j["mask"].get<std::string>().c_str(), j["density"].get<double>());
  const auto& p = j["phases_ms"];
  std::printf("  distributed %10.3f ms  (agree %.3f, scatter %.3f, local %.3f, gather %.3f; %d threads per rank)\n",
              j["dist_ms"].get<double>(), p["agree"].get<double>(), p["scatter"].get<double>(),
              p["local"].get<double>(), p["gather"].get<double>(), j["threads_per_rank"].get<int>());
  std::printf("  single      %10.3f ms  (%d threads)\n", j["single_ms"].get<double>(), j["single_threads"].get<int>());
  std::printf("  max |O_dist - O_single| = %.3g%s; LSE %.3g; vs fp64 reference on %lld rows: %.3g\n",
              j["max_abs_diff_vs_single"].get<double>(), j["bit_identical_vs_single"].get<bool>() ? " (bit-identical)" : "",
              j["max_lse_diff_vs_single"].get<double>(), (long long)j["reference_rows"].get<std::int64_t>(),
              j["max_abs_err_vs_reference"].get<double>());
  std::printf("  bytes sent per rank: %lld; Ulysses volume %.0f (ratio %.4f); control %lld\n",
              (long long)j["bytes_sent_per_rank"].get<std::int64_t>(), j["expected_ulysses_bytes_per_rank"].get<double>(),
              j["bytes_vs_expected"].get<double>(), (long long)j["control_bytes_sent_per_rank"].get<std::int64_t>());
  std::printf("  temporal permutation: %lld extra bytes between ranks (%lld temporal heads, permuted after the exchange);\n"
              "    done on the sequence shards before it: %lld bytes per rank (%lld if every head were temporal)\n",
              (long long)j["permutation_extra_bytes"].get<std::int64_t>(), (long long)j["temporal_heads"].get<std::int64_t>(),
              (long long)j["permutation_bytes_if_sharded"].get<std::int64_t>(),
              (long long)j["permutation_bytes_if_sharded_all_temporal"].get<std::int64_t>());
}

std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n') c = ' ';
  return text;
}

}  // namespace

int run_dist_bench(const BenchArgs& args) {
  if (!dist::built_with_mpi()) {
    std::fprintf(stderr, "stsa: error: bench --dist needs stsa built with MPI (configure with -DSTSA_MPI=ON and "
                         "OpenMPI installed), then run it under mpirun\n");
    return 2;
  }
  std::optional<dist::MpiSession> mpi;
  std::unique_ptr<dist::Communicator> comm;
  try {
    mpi.emplace();
    comm = mpi->world();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stsa: error: %s\n", one_line(e.what()).c_str());
    return 2;
  }
  const bool lead = comm->rank() == 0;
  try {
    const Json record = run(*comm, args);
    if (lead) {
      if (args.json)
        std::printf("%s\n", json_text(record).c_str());
      else
        print_text(record);
      std::fflush(stdout);
    }
    return 0;
  } catch (const dist::CommTimeout& e) {
    // A rank is missing or stuck and the communicator is unusable: end the whole job.
    std::fprintf(stderr, "stsa: error: %s\n", one_line(e.what()).c_str());
    std::fflush(stderr);
    comm->abort(3);
    return 3;  // not reached
  } catch (const std::exception& e) {
    // Options and the collective validation give every rank the same error: say it once.
    if (lead) std::fprintf(stderr, "stsa: error: %s\n", one_line(e.what()).c_str());
    return 2;
  }
}

}  // namespace stsa::cli
