// What the benchmarks of `stsa bench` (CPU and CUDA) and the demo share: the
// random inputs, the rows checked and their error against the fp64 reference,
// and the fields of the record that describe the case.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "stsa/attention.hpp"
#include "stsa/plan.hpp"
#include "stsa/reference.hpp"

namespace stsa::cli {

// What every benchmark (CPU, CUDA, --dist) takes from the options, parsed and
// checked (layout, dtype name, alignment, tile, repeats, rows to check) before
// anything is allocated. Which dtypes and tiles a backend takes is its own check;
// the mask is not here, since --dist also takes `mixed` and `routed`.
struct BenchSetup {
  VideoLayout layout;
  std::int64_t kv_heads = 0;  // K and V's heads: layout.heads, or fewer (grouped-query attention)
  DType dtype = DType::F32;
  Alignment alignment = Alignment::Exact;
  TileShape tile;
};
BenchSetup parse_bench_setup(const BenchArgs& args);

// The setup and one mask for every head (mask_by_name).
struct BenchOptions : BenchSetup {
  MaskSpec spec{};
};
BenchOptions parse_bench_options(const BenchArgs& args);

// All hardware threads (at least 1): where the measure_*_peak_gflops functions are
// given more threads, they scale their sum back to this many (src/cpu/fma_peak.cpp),
// so CPU-time rates are spread over no more.
int hardware_threads();

// The units a CPU bench record's "peak_of" names (to_string(ProductUnits): "fma", "bf16_dot", "amx"), in words.
const char* peak_units_text(std::string_view units);

// ResourceError when the case's host tensors (Q, K, V at the input dtype, both
// outputs at the output dtype, both LSE) need more than half this machine's memory.
void check_bench_memory(const BenchOptions& options);

// InvalidArgument when `tflop`, the work a benchmark is estimated to do (`what`:
// which calls), is above --max-tflop: a typo in the shape (--frames 2100 for 21)
// is refused at once, not run for hours without output.
void check_bench_work(const BenchArgs& args, double tflop, const std::string& what);

// One case on the host: both plans, random q, k, v, the outputs, and the dense
// and sparse calls over them. Built in place (the calls point into the tensors).
struct BenchCase {
  // check_bench_memory first; `plan`: the sparse plan, if already built for `options`.
  BenchCase(const BenchOptions& options, std::uint64_t seed, std::shared_ptr<const TilePlan> plan = nullptr);
  BenchCase(const BenchCase&) = delete;
  BenchCase& operator=(const BenchCase&) = delete;

  std::shared_ptr<const TilePlan> plan, dense_plan;
  Tensor q, k, v, o_dense, o_sparse;
  LseBuffer lse_dense, lse_sparse;
  AttentionCall dense, sparse;
};

// N(0, 1) values rounded to the tensor's dtype (a contiguous host tensor).
void fill_normal(const TensorView& t, std::uint64_t seed);

// `count` distinct rows of [0, tokens), sorted (all rows when count >= tokens).
std::vector<std::int64_t> sample_rows(std::int64_t tokens, int count, std::uint64_t seed);

struct Errors {
  double max_abs = 0, rel_l2 = 0, lse_max_abs = 0;  // NaN when the output has NaN there
};

// The call's output (host tensors) on `rows` against the fp64 reference (what
// the plan computes when `computes` is set).
Errors check_rows(const AttentionCall& call, const std::vector<std::int64_t>& rows, const PairPredicate& computes);

// A benchmark's two calls (host tensors) on `count` rows sampled with `seed`;
// the sparse call against what `plan` computes (a rounded plan's deviation from
// the exact mask is reported as changed_pairs, not as error).
struct BenchErrors {
  Errors sparse, dense;
  std::int64_t rows = 0;
};
BenchErrors check_dense_and_sparse(const AttentionCall& dense, const AttentionCall& sparse,
                                   const std::shared_ptr<const TilePlan>& plan, int count, std::uint64_t seed,
                                   bool progress);

// The record's fields every backend shares: the shape, the mask and its plan,
// the options, the FLOP counts and the errors (NaN as null).
nlohmann::json bench_case_record(const BenchArgs& args, const BenchOptions& options, const TilePlan& plan,
                                 const BenchErrors& errors);

}  // namespace stsa::cli
