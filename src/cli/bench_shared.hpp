// What the benchmarks of `stsa bench` (CPU and CUDA) and the demo share: the
// random inputs, the rows checked and their error against the fp64 reference,
// and the fields of the record that describe the case.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "stsa/attention.hpp"
#include "stsa/plan.hpp"
#include "stsa/reference.hpp"

namespace stsa::cli {

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
nlohmann::json bench_case_record(const BenchArgs& args, const VideoLayout& layout, const MaskSpec& spec, DType dtype,
                                 const TilePlan& plan, const BenchErrors& errors);

}  // namespace stsa::cli
