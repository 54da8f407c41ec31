// The reference backend: plain loops in fp64 over the mask evaluated per pair
// from the spec (never from a plan). It exists to test every other backend and
// shares no code with them but the mask predicate.
#pragma once

#include <functional>
#include <memory>

#include "stsa/attention.hpp"

namespace stsa {

std::unique_ptr<Backend> make_reference_backend();

// Per-pair override of the mask (head, query position, key position in tensor order),
// used to test a rounded plan against what it claims to compute.
using PairPredicate = std::function<bool(std::int64_t head, std::int64_t q_pos, std::int64_t k_pos)>;

// fp64 reference of selected query rows only (rows = positions in tensor order),
// writing O rows into `o` [B, rows, H, D] (fp64, contiguous) and LSE into `lse` [B, H, rows].
void reference_rows(const AttentionCall& call, const std::vector<std::int64_t>& rows, std::vector<double>& o,
                    std::vector<double>& lse, const PairPredicate& override_mask = {});

}  // namespace stsa
