// The CPU backend's scattered output (Backend::run_scattered) and gathered input
// (Backend::run_gathered), on every instruction set this machine has: packed
// heads (routed attention's temporal heads: q, k, v gathered into spatial-major
// order) whose O and LSE the kernel stores straight into the full tensors, and
// the same heads read in place from the full q, k, v, are the bytes of the
// two-step path (packed output, then scatter_heads), and the heads not listed
// are never written. Bad scattered outputs and gathered inputs are refused
// before anything is written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "stsa/cpu.hpp"
#include "stsa/error.hpp"
#include "stsa/mask.hpp"
#include "stsa/permute.hpp"
#include "stsa/plan.hpp"
#include "support/cpu_isas.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

struct ScatterCase {
  VideoLayout full;  // the caller's tensors; the packed call has targets.size() heads
  DType in = DType::F32, out = DType::F32;
  MemoryLayout memory = MemoryLayout::BNHD;
  TokenOrder order = TokenOrder::SpatialMajor;  // the packed heads' token order
  std::vector<std::int64_t> targets;            // packed head j goes to head targets[j]
  TokenOrder to = TokenOrder::FrameMajor;       // the full tensors' token order
  bool with_lse = true;
  std::int64_t skipped = -1;  // a packed head with compute = false: its target head is never written
};

// The packed call: the listed heads of `full`'s q, k, v gathered into `order`,
// alternating two plans (anchor on and off), so heads of one call differ.
struct PackedCall {
  Tensor q, k, v;
  AttentionCall call;  // o and lse empty
};

PackedCall gather_call(const ScatterCase& c, const testing::Problem& full, PlanCache& cache) {
  const VideoGrid& g = c.full.grid;
  const auto count = std::int64_t(c.targets.size());
  const SparseKind kind = c.order == TokenOrder::SpatialMajor ? SparseKind::Temporal : SparseKind::Spatial;
  const MaskSpec specs[2] = {mask_for_density(g, kind, 0.3), mask_for_density(g, kind, 0.3, false)};
  PackedCall p;
  p.call.layout = VideoLayout{g, c.full.batch, count, c.full.head_dim};
  for (Tensor* t : {&p.q, &p.k, &p.v}) *t = Tensor(c.in, c.full.batch, g.tokens(), count, c.full.head_dim);
  p.call.q = p.q.view();
  p.call.k = p.k.view();
  p.call.v = p.v.view();
  const AttentionCall source = full.call();
  const TensorView sources[] = {source.q, source.k, source.v};
  const TensorView packed[] = {p.call.q, p.call.k, p.call.v};
  gather_heads(g, c.to, c.order, c.targets, sources, packed);
  for (std::int64_t j = 0; j < count; ++j) {
    const MaskSpec& spec = specs[j % 2];
    p.call.heads.push_back({spec, c.order, cache.get(g, spec), j != c.skipped});
  }
  return p;
}

// run_scattered refuses `out` with InvalidArgument naming `fragment`.
void expect_refused(const Backend& backend, const AttentionCall& call, const ScatteredOutput& out,
                    const std::string& fragment) {
  try {
    backend.run_scattered(call, out);
    ADD_FAILURE() << "accepted; expected an error naming '" << fragment << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

void expect_scattered_matches_two_step(const Backend& backend, const ScatterCase& c) {
  const VideoGrid& g = c.full.grid;
  const auto count = std::int64_t(c.targets.size());
  // Only the tensors of the full problem are used; its heads are never run.
  testing::Problem fused = testing::make_problem(c.full, c.in, std::vector<HeadMask>(std::size_t(c.full.heads)),
                                                 testing::fresh_seed(), c.memory, c.out);
  testing::Problem two_step = fused;  // deep copies: the same inputs, O and LSE poisoned with NaN
  testing::Problem gathered = fused;
  SCOPED_TRACE(fused.label);
  PlanCache cache;
  const PackedCall packed = gather_call(c, fused, cache);

  // The two-step path: a packed output poisoned like the full one (so a skipped
  // head scatters NaN, which the fused path leaves in place by not writing), then scatter_heads.
  AttentionCall with_output = packed.call;
  Tensor o(c.out, c.full.batch, g.tokens(), count, c.full.head_dim);
  LseBuffer lse(c.full.batch, count, g.tokens());
  for (std::int64_t b = 0; b < c.full.batch; ++b)
    for (std::int64_t n = 0; n < g.tokens(); ++n)
      for (std::int64_t j = 0; j < count; ++j) {
        for (std::int64_t d = 0; d < c.full.head_dim; ++d) o.view().store(b, n, j, d, std::nanf(""));
        lse.view().at(b, j, n) = std::nanf("");
      }
  with_output.o = o.view();
  with_output.lse = c.with_lse ? lse.view() : LseView{};
  backend.run(with_output);
  const TensorView packed_o[] = {with_output.o};
  const TensorView full_o[] = {two_step.o.view()};
  scatter_heads(g, c.order, c.to, c.targets, packed_o, full_o, with_output.lse,
                c.with_lse ? two_step.lse.view() : LseView{});

  backend.run_scattered(packed.call, ScatteredOutput{g, c.order, c.to, c.targets, fused.o.view(),
                                                     c.with_lse ? fused.lse.view() : LseView{}});
  // The same heads read in place: no packed copies (the call's inputs empty).
  AttentionCall in_place = packed.call;
  in_place.q = in_place.k = in_place.v = TensorView{};
  const AttentionCall sources = gathered.call();
  backend.run_gathered(in_place, GatheredInput{g, c.to, c.order, c.targets, sources.q, sources.k, sources.v},
                       ScatteredOutput{g, c.order, c.to, c.targets, gathered.o.view(),
                                       c.with_lse ? gathered.lse.view() : LseView{}});

  for (testing::Problem* run : {&fused, &gathered}) {
    SCOPED_TRACE(run == &fused ? "scattered output" : "gathered input");
    EXPECT_TRUE(run->o.guards_intact() && run->lse.guards_intact()) << "guard bytes around O or LSE overwritten";
    const TensorView a = run->o.view(), b = two_step.o.view();
    std::int64_t mismatched_o = 0, written_o = 0, mismatched_lse = 0, written_lse = 0;
    for (std::int64_t batch = 0; batch < c.full.batch; ++batch)
      for (std::int64_t n = 0; n < g.tokens(); ++n)
        for (std::int64_t h = 0; h < c.full.heads; ++h) {
          for (std::int64_t d = 0; d < c.full.head_dim; ++d) {
            const float x = a.load(batch, n, h, d), y = b.load(batch, n, h, d);
            mismatched_o += std::memcmp(&x, &y, sizeof(float)) != 0;
            written_o += !std::isnan(x);
          }
          const float x = run->lse.view().at(batch, h, n), y = two_step.lse.view().at(batch, h, n);
          mismatched_lse += std::memcmp(&x, &y, sizeof(float)) != 0;
          written_lse += !std::isnan(x);
        }
    EXPECT_EQ(mismatched_o, 0) << "other O values than the two-step path";
    EXPECT_EQ(mismatched_lse, 0);
    // Exactly the computed listed heads' rows were stored (the others keep the NaN poison).
    const std::int64_t stored = count - (c.skipped >= 0 ? 1 : 0);
    EXPECT_EQ(written_o, c.full.batch * stored * g.tokens() * c.full.head_dim);
    EXPECT_EQ(written_lse, c.with_lse ? c.full.batch * stored * g.tokens() : 0);
  }
}

// Two plans among the packed heads, text before and after the video, ragged
// tiles, both memory layouts, every output dtype, head dims 64/80/96/128; a
// same-order case remaps heads only.
TEST(CpuScatteredOutput, IsTheGatheredCallScatteredOnEveryIsa) {
  const std::vector<ScatterCase> cases = {
      {{{5, 7, 9, 13, TextPlacement::Before}, 2, 5, 64}, DType::F32, DType::F32, MemoryLayout::BNHD,
       TokenOrder::SpatialMajor, {3, 0, 4}},
      {{{4, 5, 6, 70, TextPlacement::After}, 1, 4, 80}, DType::F16, DType::F32, MemoryLayout::BHND,
       TokenOrder::SpatialMajor, {2, 1}},
      {{{6, 8, 11, 0, TextPlacement::After}, 1, 3, 128}, DType::BF16, DType::BF16, MemoryLayout::BNHD,
       TokenOrder::SpatialMajor, {2, 0, 1}},
      {{{3, 7, 9, 0, TextPlacement::After}, 1, 3, 96}, DType::BF16, DType::F16, MemoryLayout::BNHD,
       TokenOrder::FrameMajor, {2, 0}},
      {{{1, 9, 10, 5, TextPlacement::Before}, 1, 2, 64}, DType::BF16, DType::F32, MemoryLayout::BNHD,
       TokenOrder::SpatialMajor, {1}},  // one frame: both orders are the same
      // The other direction (frame-major heads into spatial-major tensors), no LSE.
      {{{5, 6, 7, 4, TextPlacement::After}, 1, 3, 64}, DType::F32, DType::BF16, MemoryLayout::BNHD,
       TokenOrder::FrameMajor, {1, 2}, TokenOrder::SpatialMajor, /*with_lse=*/false},
      // A skipped packed head: its target head (0) is never written.
      {{{4, 5, 6, 0, TextPlacement::After}, 2, 4, 64}, DType::F16, DType::F32, MemoryLayout::BHND,
       TokenOrder::SpatialMajor, {3, 0, 1}, TokenOrder::FrameMajor, true, /*skipped=*/1},
  };
  for (const Isa isa : testing::isas_of_this_machine()) {
    SCOPED_TRACE(std::string(to_string(isa)));
    const auto backend = make_cpu_backend({isa, 2});
    ASSERT_TRUE(backend->runs_scattered() && backend->runs_gathered());
    for (const ScatterCase& c : cases) expect_scattered_matches_two_step(*backend, c);
  }
}

// What the refusal tests start from: a 3-head problem (O and LSE poisoned with
// NaN) and its heads 2 and 0 packed in `order`.
struct RefusalCase {
  explicit RefusalCase(TokenOrder order)
      : problem(testing::make_problem(full, DType::F32, std::vector<HeadMask>(3), testing::fresh_seed())),
        c{full, DType::F32, DType::F32, MemoryLayout::BNHD, order, {2, 0}},
        packed(gather_call(c, problem, cache)) {}

  const VideoLayout full{{3, 4, 5, 6, TextPlacement::After}, 1, 3, 64};
  testing::Problem problem;
  PlanCache cache;
  const ScatterCase c;
  const PackedCall packed;
};

// Every O and LSE element still holds its NaN poison.
void expect_nothing_written(const testing::Problem& problem) {
  const VideoLayout& full = problem.layout;
  for (std::int64_t b = 0; b < full.batch; ++b)
    for (std::int64_t n = 0; n < full.tokens(); ++n)
      for (std::int64_t h = 0; h < full.heads; ++h) {
        ASSERT_TRUE(std::isnan(problem.lse.view().at(b, h, n))) << "LSE written by a refused call";
        for (std::int64_t d = 0; d < full.head_dim; ++d)
          ASSERT_TRUE(std::isnan(problem.o.view().load(b, n, h, d))) << "O written by a refused call";
      }
}

// The backend-neutral checks (scattered_call_for_checks), each refused with a
// message naming it, before any output is written; and a backend that does
// not store scattered outputs says so.
TEST(CpuScatteredOutput, BadScatteredOutputsAreRefusedBeforeAnythingIsWritten) {
  RefusalCase r(TokenOrder::FrameMajor);
  auto& [full, problem, cache, c, packed] = r;
  const std::vector<std::int64_t> heads = c.targets, twice = {1, 1}, outside = {0, 3}, one = {0},
                                  swapped = {1, 0};
  const ScatteredOutput out{full.grid, TokenOrder::FrameMajor, TokenOrder::FrameMajor, heads, problem.o.view(),
                            problem.lse.view()};
  const auto backend = make_cpu_backend({Isa::Auto, 2});
  const auto expect_invalid = [&](const AttentionCall& call, const ScatteredOutput& o, const std::string& fragment) {
    expect_refused(*backend, call, o, fragment);
  };
  AttentionCall with_o = packed.call;
  Tensor packed_o(DType::F32, full.batch, full.tokens(), 2, full.head_dim);
  with_o.o = packed_o.view();
  expect_invalid(with_o, out, "must be empty");
  ScatteredOutput bad = out;
  bad.heads = twice;
  expect_invalid(packed.call, bad, "listed twice");
  bad.heads = outside;
  expect_invalid(packed.call, bad, "out of range");
  bad.heads = one;
  expect_invalid(packed.call, bad, "1 output heads for 2 heads");
  bad = out;
  bad.grid.frames = 2;
  expect_invalid(packed.call, bad, "output grid");
  bad = out;
  bad.o = packed.call.q;  // the output over an input (two heads: a valid full tensor otherwise)
  bad.heads = swapped;
  bad.lse = LseView{};
  expect_invalid(packed.call, bad, "o overlaps an input");
  bad = out;
  bad.lse.data = static_cast<float*>(packed.call.v.data);  // 3 LSE rows inside V's 2 x 64 floats per token
  expect_invalid(packed.call, bad, "lse overlaps an input");
  bad = out;
  bad.o.shape[3] = 32;
  expect_invalid(packed.call, bad, "scattered o has shape");
  bad = out;
  bad.o.shape[2] = -100;  // a head count no layout has (not an allocation of that size)
  expect_invalid(packed.call, bad, "heads");
  bad = out;
  bad.lse.shape[1] = 2;
  expect_invalid(packed.call, bad, "scattered lse has shape");
  bad = out;
  bad.lse.stride[1] = 0;  // every head's LSE row in one place
  expect_invalid(packed.call, bad, "scattered lse has overlapping strides");
  bad = out;
  bad.lse.data = reinterpret_cast<float*>(problem.o.view().data);
  expect_invalid(packed.call, bad, "lse overlaps o");
  bad = out;
  bad.o.data = nullptr;
  expect_invalid(packed.call, bad, "no output tensor");
  bad = out;
  bad.from = TokenOrder::SpatialMajor;  // the heads' plans are frame-major
  expect_invalid(packed.call, bad, "tokens are in frame-major order");
  bad = out;
  bad.to = TokenOrder(7);
  expect_invalid(packed.call, bad, "not TokenOrder values");
  bad = out;
  bad.o.stride[2] = full.head_dim / 2;  // the heads overlap each other
  expect_invalid(packed.call, bad, "scattered o has overlapping strides");
  // One head in the call: its narrowed view has one head, so the full tensor's
  // overlapping heads are seen only by the check of the full tensor.
  const AttentionCall one_head = testing::first_heads(packed.call, 1);
  bad = out;
  bad.heads = std::span<const std::int64_t>(heads).first(1);
  bad.o.stride[2] = full.head_dim / 2;
  expect_invalid(one_head, bad, "scattered o has overlapping strides");
  expect_nothing_written(problem);
  // The valid call runs.
  backend->run_scattered(packed.call, out);
  EXPECT_FALSE(std::isnan(problem.lse.view().at(0, 2, 0)));

  const Backend& reference = stsa::backend("reference");
  EXPECT_FALSE(reference.runs_scattered());
  EXPECT_THROW(reference.run_scattered(packed.call, out), Unsupported);
}

// The gathered input's own checks (gathered_call_for_checks), each refused with
// a message naming it before any output is written (the scattered output's are
// the test above's); a backend that does not read gathered inputs says so.
TEST(CpuScatteredOutput, BadGatheredInputsAreRefusedBeforeAnythingIsWritten) {
  RefusalCase r(TokenOrder::SpatialMajor);
  auto& [full, problem, cache, c, packed] = r;
  AttentionCall call = packed.call;
  call.q = call.k = call.v = TensorView{};
  // Sources of their own, so that the output (the problem's o) overlaps none of them.
  const testing::Problem sources_problem =
      testing::make_problem(full, DType::F32, std::vector<HeadMask>(3), testing::fresh_seed());
  const AttentionCall sources = sources_problem.call();
  const std::vector<std::int64_t> heads = c.targets, outside = {0, 3}, one = {0}, twice = {2, 2};
  const GatheredInput in{full.grid, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, heads,
                         sources.q, sources.k, sources.v};
  const ScatteredOutput out{full.grid, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, heads, problem.o.view(),
                            problem.lse.view()};
  const auto backend = make_cpu_backend({Isa::Auto, 2});
  const auto expect_invalid = [&](const AttentionCall& the_call, const GatheredInput& the_in,
                                  const ScatteredOutput& the_out, const std::string& fragment) {
    try {
      backend->run_gathered(the_call, the_in, the_out);
      ADD_FAILURE() << "accepted; expected an error naming '" << fragment << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_invalid(packed.call, in, out, "call.q, call.k and call.v must be empty");
  GatheredInput bad = in;
  bad.heads = outside;
  expect_invalid(call, bad, out, "input head 3 out of range");
  bad.heads = one;
  expect_invalid(call, bad, out, "1 input heads for 2 heads");
  bad.heads = twice;
  expect_invalid(call, bad, out, "input head 2 listed twice");
  bad = in;
  bad.grid.frames = 2;
  expect_invalid(call, bad, out, "input grid");
  bad = in;
  bad.to = TokenOrder::FrameMajor;  // the heads' plans are spatial-major
  expect_invalid(call, bad, out, "the input says frame-major");
  bad = in;
  bad.from = TokenOrder(7);
  expect_invalid(call, bad, out, "not TokenOrder values");
  bad = in;
  bad.v.data = nullptr;
  expect_invalid(call, bad, out, "no input tensor");
  bad = in;
  bad.k.shape[3] = 32;
  expect_invalid(call, bad, out, "gathered k has shape");
  bad = in;
  bad.q.stride[2] = full.head_dim / 2;  // the heads overlap each other
  expect_invalid(call, bad, out, "gathered q has overlapping strides");
  bad = in;
  bad.v = problem.o.view();  // V read from the output being written
  expect_invalid(call, bad, out, "o overlaps an input");
  expect_nothing_written(problem);
  // The valid call runs.
  backend->run_gathered(call, in, out);
  EXPECT_FALSE(std::isnan(problem.lse.view().at(0, 2, 0)));

  const Backend& reference = stsa::backend("reference");
  EXPECT_FALSE(reference.runs_gathered());
  EXPECT_THROW(reference.run_gathered(call, in, out), Unsupported);
}

// Overlaps that only the full tensors show (the narrowed views of the call's
// heads do not overlap anything): with a BHND full O, head 2 lies past the
// narrowed extent, so without the full-extent checks the kernel would store
// head 2's rows over q or over the LSE.
TEST(CpuScatteredOutput, OverlapsOnlyTheFullTensorsShowAreRefused) {
  const VideoLayout full{{3, 4, 5, 0, TextPlacement::After}, 1, 3, 64};
  const std::int64_t n = full.tokens(), d = full.head_dim;
  testing::Problem problem = testing::make_problem(full, DType::F32, std::vector<HeadMask>(3), testing::fresh_seed());
  PlanCache cache;
  const ScatterCase c{full, DType::F32, DType::F32, MemoryLayout::BNHD, TokenOrder::FrameMajor, {2, 0}};
  const PackedCall packed = gather_call(c, problem, cache);
  const std::vector<std::int64_t> heads = c.targets;
  const auto backend = make_cpu_backend({Isa::Auto, 2});
  const auto expect_invalid = [&](const AttentionCall& call, const ScatteredOutput& o, const std::string& fragment) {
    expect_refused(*backend, call, o, fragment);
  };
  const std::size_t q_floats = std::size_t(2 * n * d);
  // (a) q inside O's head-2 block: O is [H][N][D] at arena[0, 3 N D), q at arena[2 N D, 4 N D).
  std::vector<float> arena(std::size_t(4 * n * d));
  std::memcpy(arena.data() + 2 * n * d, packed.call.q.data, q_floats * sizeof(float));
  AttentionCall call = packed.call;
  call.q.data = arena.data() + 2 * n * d;
  const TensorView o_bhnd = TensorView::contiguous(arena.data(), DType::F32, 1, n, 3, d, MemoryLayout::BHND);
  expect_invalid(call, ScatteredOutput{full.grid, TokenOrder::FrameMajor, TokenOrder::FrameMajor, heads, o_bhnd, {}},
                 "scattered output: o overlaps an input tensor");
  // (b) the LSE inside O's head-2 block.
  std::vector<float> o_storage(std::size_t(3 * n * d));
  const TensorView o = TensorView::contiguous(o_storage.data(), DType::F32, 1, n, 3, d, MemoryLayout::BHND);
  const LseView lse_in_o = LseView::contiguous(o_storage.data() + 2 * n * d, 1, 3, n);
  expect_invalid(packed.call, ScatteredOutput{full.grid, TokenOrder::FrameMajor, TokenOrder::FrameMajor, heads, o,
                                              lse_in_o},
                 "scattered output: lse overlaps o");
  // (c) the LSE's head-2 row over q's first N floats: LSE at arena2[0, 3 N), q at arena2[2 N, ...).
  std::vector<float> arena2(std::size_t(2 * n) + q_floats);
  std::memcpy(arena2.data() + 2 * n, packed.call.q.data, q_floats * sizeof(float));
  call = packed.call;
  call.q.data = arena2.data() + 2 * n;
  expect_invalid(call, ScatteredOutput{full.grid, TokenOrder::FrameMajor, TokenOrder::FrameMajor, heads, o,
                                       LseView::contiguous(arena2.data(), 1, 3, n)},
                 "scattered output: lse overlaps an input tensor");
}

}  // namespace
}  // namespace stsa
