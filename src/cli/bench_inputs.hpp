// What `stsa bench` and the demo feed every backend and how they check it:
// random inputs, the rows checked, and the error of those rows against the
// fp64 reference.
#pragma once

#include <cstdint>
#include <vector>

#include "stsa/attention.hpp"
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

}  // namespace stsa::cli
