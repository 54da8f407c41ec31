#include "stsa/plan.hpp"

#include <algorithm>
#include <bit>

#include "stsa/error.hpp"

namespace stsa {

std::string_view to_string(Alignment a) { return a == Alignment::Exact ? "exact" : "round"; }

Alignment parse_alignment(std::string_view name) {
  if (name == "exact") return Alignment::Exact;
  if (name == "round") return Alignment::Round;
  throw InvalidArgument(detail::concat("alignment must be exact or round, got '", name, "'"));
}

void TileShape::validate() const {
  STSA_CHECK(q >= 1 && q <= 1024, InvalidArgument, "query tile rows must be in [1, 1024], got ", q);
  STSA_CHECK(k >= 64 && k <= 1024 && k % 64 == 0, InvalidArgument,
             "key tile columns must be a multiple of 64 in [64, 1024], got ", k);
}

double PlanStats::tile_density() const {
  const std::int64_t all = tiles_full + tiles_partial + tiles_empty;
  return all ? double(tiles_full + tiles_partial) / double(all) : 0.0;
}

namespace {

// The accessors index the CSR arrays directly: a row or id outside the plan would read past them.
void check_row(std::int64_t q_tile, std::int64_t q_tiles) {
  STSA_CHECK(q_tile >= 0 && q_tile < q_tiles, InvalidArgument, "query tile ", q_tile, " outside the plan's ", q_tiles,
             " rows");
}

}  // namespace

std::span<const std::int32_t> TilePlan::full_tiles(std::int64_t q_tile) const {
  check_row(q_tile, q_tiles_);
  const auto begin = std::size_t(row_begin_[std::size_t(q_tile)]);
  const auto end = std::size_t(partial_begin_[std::size_t(q_tile)]);
  return {key_tiles_.data() + begin, end - begin};
}

std::span<const std::int32_t> TilePlan::partial_tiles(std::int64_t q_tile) const {
  check_row(q_tile, q_tiles_);
  const auto begin = std::size_t(partial_begin_[std::size_t(q_tile)]);
  const auto end = std::size_t(row_begin_[std::size_t(q_tile) + 1]);
  return {key_tiles_.data() + begin, end - begin};
}

std::span<const std::int32_t> TilePlan::partial_mask_ids(std::int64_t q_tile) const {
  check_row(q_tile, q_tiles_);
  const auto begin = std::size_t(partial_begin_[std::size_t(q_tile)]);
  const auto end = std::size_t(row_begin_[std::size_t(q_tile) + 1]);
  return {mask_ids_.data() + begin, end - begin};
}

const std::uint64_t* TilePlan::mask(std::int32_t id) const {
  STSA_CHECK(id >= 0 && id < stats_.distinct_masks, InvalidArgument, "mask id ", id, " outside the plan's ",
             stats_.distinct_masks, " masks");
  return masks_.data() + std::size_t(id) * std::size_t(tile_.q) * std::size_t(mask_words_per_row());
}

TileClass TilePlan::classify(std::int64_t q_tile, std::int64_t k_tile) const {
  STSA_CHECK(q_tile >= 0 && q_tile < q_tiles_ && k_tile >= 0 && k_tile < k_tiles_, InvalidArgument, "tile (",
             q_tile, ", ", k_tile, ") outside the ", q_tiles_, " x ", k_tiles_, " plan");
  const auto full = full_tiles(q_tile);
  if (std::binary_search(full.begin(), full.end(), std::int32_t(k_tile))) return TileClass::Full;
  const auto partial = partial_tiles(q_tile);
  if (std::binary_search(partial.begin(), partial.end(), std::int32_t(k_tile))) return TileClass::Partial;
  return TileClass::Empty;
}

bool TilePlan::computes(std::int64_t q_pos, std::int64_t k_pos) const {
  // Checked here, not by tile: a ragged last tile holds positions past the matrix, and
  // q_pos / tile rounds -1 into tile 0.
  STSA_CHECK(q_pos >= 0 && q_pos < tokens() && k_pos >= 0 && k_pos < tokens(), InvalidArgument, "pair (", q_pos,
             ", ", k_pos, ") outside the plan's ", tokens(), " tokens");
  const std::int64_t qt = q_pos / tile_.q, kt = k_pos / tile_.k;
  switch (classify(qt, kt)) {
    case TileClass::Empty: return false;
    case TileClass::Full: return true;
    case TileClass::Partial: break;
  }
  const auto partial = partial_tiles(qt);
  const auto at = std::lower_bound(partial.begin(), partial.end(), std::int32_t(kt)) - partial.begin();
  const std::uint64_t* row = mask(partial_mask_ids(qt)[std::size_t(at)]) +
                             std::size_t(q_pos - qt * tile_.q) * std::size_t(mask_words_per_row());
  const std::int64_t c = k_pos - kt * tile_.k;
  return (row[c / 64] >> (c % 64)) & 1u;
}

void TilePlan::check_matches(const VideoGrid& grid, const MaskSpec& spec, TokenOrder tensor_order) const {
  STSA_CHECK(grid == grid_, InvalidArgument, "plan was built for grid ", grid_.describe(), " but the call has ",
             grid.describe());
  STSA_CHECK(spec == spec_, InvalidArgument, "plan was built for mask '", spec_.describe(), "' but the head has '",
             spec.describe(), "'");
  STSA_CHECK(tensor_order == order(), InvalidArgument, "plan indexes tokens in ", to_string(order()),
             " order but the head's tensors are in ", to_string(tensor_order),
             " order (permute temporal heads first)");
}

void TilePlan::self_check() const {
  STSA_CHECK(row_begin_.size() == std::size_t(q_tiles_) + 1 && partial_begin_.size() == std::size_t(q_tiles_),
             Error, "plan CSR has wrong row count");
  std::int64_t full = 0, partial = 0;
  for (std::int64_t qt = 0; qt < q_tiles_; ++qt) {
    const auto f = full_tiles(qt), p = partial_tiles(qt);
    STSA_CHECK(std::is_sorted(f.begin(), f.end()) && std::is_sorted(p.begin(), p.end()), Error,
               "plan row ", qt, " key tiles are not ascending");
    for (auto kt : f) STSA_CHECK(kt >= 0 && kt < k_tiles_, Error, "plan row ", qt, " lists key tile ", kt);
    for (auto kt : p) STSA_CHECK(kt >= 0 && kt < k_tiles_, Error, "plan row ", qt, " lists partial key tile ", kt);
    for (auto id : partial_mask_ids(qt))
      STSA_CHECK(id >= 0 && std::int64_t(id) < stats_.distinct_masks, Error, "plan row ", qt, " mask id ", id);
    full += std::int64_t(f.size());
    partial += std::int64_t(p.size());
  }
  STSA_CHECK(full == stats_.tiles_full && partial == stats_.tiles_partial, Error, "plan tile counts disagree");
}

std::shared_ptr<const TilePlan> PlanCache::get(const VideoGrid& grid, const MaskSpec& spec, TileShape tile,
                                               Alignment alignment) {
  std::lock_guard lock(mutex_);
  for (const auto& plan : plans_)
    if (plan->grid() == grid && plan->spec() == spec && plan->tile() == tile && plan->alignment() == alignment)
      return plan;
  plans_.push_back(TilePlan::build(grid, spec, tile, alignment));
  return plans_.back();
}

std::size_t PlanCache::size() const {
  std::lock_guard lock(mutex_);
  return plans_.size();
}

void PlanCache::clear() {
  std::lock_guard lock(mutex_);
  plans_.clear();
}

}  // namespace stsa
