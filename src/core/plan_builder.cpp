// Builds a TilePlan analytically from a MaskSpec.
//
// In the spec's natural order every sequence splits into "always" tokens (text,
// and frame 0 when the anchor is on: they attend to and are attended by all)
// and one contiguous run of "regular" video tokens, between which the rule
// holds: |g(q) - g(k)| <= t, with g the position (band) or the frame index
// (frame window). g is monotone, so a tile's min and max g-distance come from
// its corners, which makes each tile's class O(1) and lets each query tile
// visit only the key tiles its band can reach.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <unordered_map>

#include "stsa/error.hpp"
#include "stsa/plan.hpp"
#include "stsa/tensor.hpp"

namespace stsa {
namespace {

struct Range {
  std::int64_t begin = 0, end = 0;  // [begin, end)
  bool empty() const { return begin >= end; }
  Range intersect(Range other) const { return {std::max(begin, other.begin), std::min(end, other.end)}; }
};

// The mask rule in the plan's position space.
struct Rule {
  std::int64_t tokens = 0;
  Range regular;                 // positions that follow the rule
  std::int64_t video_begin = 0;  // for frame indices
  std::int64_t per_frame = 1;
  bool by_frame = false;         // g = frame index instead of position
  std::int64_t threshold = 0;    // allowed iff |g(q) - g(k)| <= threshold; < 0 never
  bool dense = false;

  std::int64_t g(std::int64_t x) const { return by_frame ? (x - video_begin) / per_frame : x; }
  bool is_regular(std::int64_t x) const { return x >= regular.begin && x < regular.end; }

  // Regular keys a regular query row at `q` may see.
  Range reach(std::int64_t q) const {
    if (threshold < 0) return {0, 0};
    if (!by_frame) return Range{q - threshold, q + threshold + 1}.intersect(regular);
    const std::int64_t f = g(q);
    return Range{video_begin + (f - threshold) * per_frame, video_begin + (f + threshold + 1) * per_frame}.intersect(
        regular);
  }
  // Regular keys that some regular row of [rows] may see.
  Range reach(Range rows) const {
    if (rows.empty() || threshold < 0) return {0, 0};
    return {reach(rows.begin).begin, reach(rows.end - 1).end};
  }
};

Rule make_rule(const VideoGrid& grid, const MaskSpec& spec) {
  Rule rule;
  rule.tokens = grid.tokens();
  rule.video_begin = grid.video_begin();
  rule.per_frame = grid.tokens_per_frame();
  rule.dense = spec.kind == MaskKind::Dense;
  const std::int64_t anchor = spec.anchor ? grid.tokens_per_frame() : 0;
  rule.regular = {grid.video_begin() + anchor, grid.video_end()};
  rule.by_frame = spec.kind == MaskKind::FrameWindow;
  // Clamped so that position arithmetic cannot overflow; anything wider keeps every pair anyway.
  rule.threshold = std::min(rule.by_frame ? spec.frame_radius : spec.band, rule.tokens);
  return rule;
}

class MaskStore {
 public:
  explicit MaskStore(std::size_t words_per_mask) : words_(words_per_mask) {}

  std::int32_t intern(const std::vector<std::uint64_t>& mask) {
    std::uint64_t hash = 1469598103934665603ull;
    for (std::uint64_t w : mask) hash = (hash ^ w) * 1099511628211ull;
    auto& ids = by_hash_[hash];
    for (std::int32_t id : ids)
      if (std::memcmp(&data_[std::size_t(id) * words_], mask.data(), words_ * 8) == 0) return id;
    const auto id = std::int32_t(data_.size() / words_);
    data_.insert(data_.end(), mask.begin(), mask.end());
    ids.push_back(id);
    return id;
  }
  std::vector<std::uint64_t> release() { return std::move(data_); }

 private:
  std::size_t words_;
  std::vector<std::uint64_t> data_;
  std::unordered_map<std::uint64_t, std::vector<std::int32_t>> by_hash_;
};

void set_bits(std::uint64_t* row, std::int64_t begin, std::int64_t end) {
  for (std::int64_t c = begin; c < end;) {
    const std::int64_t word = c / 64, bit = c % 64;
    const std::int64_t count = std::min<std::int64_t>(64 - bit, end - c);
    const std::uint64_t bits = count == 64 ? ~0ull : ((1ull << count) - 1) << bit;
    row[word] |= bits;
    c += count;
  }
}

}  // namespace

class PlanBuilder {
 public:
  PlanBuilder(const VideoGrid& grid, const MaskSpec& spec, TileShape tile, Alignment alignment)
      : rule_(make_rule(grid, spec)), tile_(tile), alignment_(alignment),
        words_per_row_(tile.k / 64), store_(std::size_t(tile.q) * std::size_t(tile.k / 64)) {
    plan_ = std::shared_ptr<TilePlan>(new TilePlan());
    plan_->grid_ = grid;
    plan_->spec_ = spec;
    plan_->tile_ = tile;
    plan_->alignment_ = alignment;
    plan_->q_tiles_ = (rule_.tokens + tile.q - 1) / tile.q;
    plan_->k_tiles_ = (rule_.tokens + tile.k - 1) / tile.k;
  }

  std::shared_ptr<const TilePlan> build() {
    const auto start = std::chrono::steady_clock::now();
    TilePlan& p = *plan_;
    PlanStats& s = p.stats_;
    s.total_pairs = rule_.tokens * rule_.tokens;
    s.exact_kept_pairs = kept_pairs(p.grid_, p.spec_);
    // Room for every candidate tile, so that the arrays never regrow, and, where every
    // candidate is kept, shrink_to_fit below copies nothing: that copy doubled the peak.
    const std::size_t candidates = count_candidate_tiles();
    // A plan that cannot fit is refused before it is built (a dense plan of a 2e9-token grid
    // would have run for hours): its tile lists alone need this much.
    check_host_allocation(std::uint64_t(candidates) * (sizeof(std::int32_t) + sizeof(std::int32_t)) +
                              std::uint64_t(p.q_tiles_) * 16,
                          "the tile plan");
    // The row arrays only after that check, which counts them: for a grid of 2^31 one-row
    // tiles they alone were 32 GiB, and their std::bad_alloc came before the ResourceError.
    p.row_begin_.reserve(std::size_t(p.q_tiles_) + 1);
    p.partial_begin_.reserve(std::size_t(p.q_tiles_));
    p.row_begin_.push_back(0);
    p.key_tiles_.reserve(candidates);
    p.mask_ids_.reserve(candidates);
    std::vector<std::int32_t> full, partial;
    std::vector<std::int32_t> partial_ids;
    for (std::int64_t qt = 0; qt < p.q_tiles_; ++qt) {
      full.clear();
      partial.clear();
      partial_ids.clear();
      const Range rows = tile_rows(qt);
      for_each_candidate(rows, [&](std::int64_t kt) {
        const Range cols = tile_cols(kt);
        const TileClass cls = classify(rows, cols);
        if (cls == TileClass::Full) {
          full.push_back(std::int32_t(kt));
          s.kept_tile_area += area(rows, cols);
        } else if (cls == TileClass::Partial) {
          add_partial(rows, cols, kt, full, partial, partial_ids);
        }
      });
      p.key_tiles_.insert(p.key_tiles_.end(), full.begin(), full.end());
      p.mask_ids_.insert(p.mask_ids_.end(), full.size(), -1);
      p.partial_begin_.push_back(std::int64_t(p.key_tiles_.size()));
      p.key_tiles_.insert(p.key_tiles_.end(), partial.begin(), partial.end());
      p.mask_ids_.insert(p.mask_ids_.end(), partial_ids.begin(), partial_ids.end());
      p.row_begin_.push_back(std::int64_t(p.key_tiles_.size()));
      s.tiles_full += std::int64_t(full.size());
      s.tiles_partial += std::int64_t(partial.size());
    }
    p.masks_ = store_.release();
    s.tiles_empty = p.q_tiles_ * p.k_tiles_ - s.tiles_full - s.tiles_partial;
    s.kept_pairs = s.exact_kept_pairs + s.added_pairs - s.removed_pairs;
    s.changed_pairs = s.added_pairs + s.removed_pairs;
    s.distinct_masks = std::int64_t(p.masks_.size() / (std::size_t(tile_.q) * std::size_t(words_per_row_)));
    p.key_tiles_.shrink_to_fit();  // a copy only where some candidates were empty or rounded away
    p.mask_ids_.shrink_to_fit();
    s.plan_bytes = std::int64_t(sizeof(TilePlan) + p.row_begin_.size() * 8 + p.partial_begin_.size() * 8 +
                                p.key_tiles_.size() * 4 + p.mask_ids_.size() * 4 + p.masks_.size() * 8);
    s.build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return plan_;
  }

 private:
  Range tile_rows(std::int64_t qt) const { return {qt * tile_.q, std::min(rule_.tokens, (qt + 1) * tile_.q)}; }
  Range tile_cols(std::int64_t kt) const { return {kt * tile_.k, std::min(rule_.tokens, (kt + 1) * tile_.k)}; }
  static std::int64_t area(Range rows, Range cols) { return (rows.end - rows.begin) * (cols.end - cols.begin); }

  // The candidate tiles, O(1) per row: a bound on the kept ones, which they all are but
  // where a partial tile is rounded away or a run's end tile holds no allowed pair.
  std::size_t count_candidate_tiles() const {
    if (rule_.dense) return std::size_t(plan_->q_tiles_) * std::size_t(plan_->k_tiles_);  // not a loop of 2^31 rows
    std::size_t count = 0;
    for (std::int64_t qt = 0; qt < plan_->q_tiles_; ++qt)
      for_each_candidate_run(tile_rows(qt), [&](Range tiles) { count += std::size_t(tiles.end - tiles.begin); });
    return count;
  }

  // Whether the range holds a token outside the regular run (text or anchor).
  bool has_always(Range r) const { return r.begin < rule_.regular.begin || r.end > rule_.regular.end; }

  // Calls visit(tiles) in ascending order for disjoint runs of key tiles that hold every
  // key tile that may hold an allowed pair.
  template <class Visit>
  void for_each_candidate_run(Range rows, Visit&& visit) const {
    if (rule_.dense || has_always(rows)) {
      visit(Range{0, plan_->k_tiles_});
      return;
    }
    // Always keys lie before and after the regular run; regular keys within reach.
    Range spans[3] = {{0, rule_.regular.begin}, rule_.reach(rows.intersect(rule_.regular)),
                      {rule_.regular.end, rule_.tokens}};
    std::int64_t next = 0;  // first tile not visited yet
    for (const Range& span : spans) {
      if (span.empty()) continue;
      const Range tiles{std::max(next, span.begin / tile_.k), (span.end - 1) / tile_.k + 1};
      if (!tiles.empty()) visit(tiles);
      next = std::max(next, tiles.end);
    }
  }

  // Calls visit(kt) in ascending order for every key tile that may hold an allowed pair.
  template <class Visit>
  void for_each_candidate(Range rows, Visit&& visit) const {
    for_each_candidate_run(rows, [&](Range tiles) {
      for (std::int64_t kt = tiles.begin; kt < tiles.end; ++kt) visit(kt);
    });
  }

  TileClass classify(Range rows, Range cols) const {
    if (rule_.dense) return TileClass::Full;
    const Range q = rows.intersect(rule_.regular), k = cols.intersect(rule_.regular);
    // No regular row: every row sees all keys. No regular key: every key is seen by all rows.
    if (q.empty() || k.empty()) return TileClass::Full;
    const std::int64_t max_distance =
        std::max(std::abs(rule_.g(q.end - 1) - rule_.g(k.begin)), std::abs(rule_.g(k.end - 1) - rule_.g(q.begin)));
    const bool rule_all = rule_.threshold >= 0 && max_distance <= rule_.threshold;
    if (rule_all) return TileClass::Full;
    const std::int64_t gap = std::max<std::int64_t>(
        {0, rule_.g(k.begin) - rule_.g(q.end - 1), rule_.g(q.begin) - rule_.g(k.end - 1)});
    const bool rule_none = rule_.threshold < 0 || gap > rule_.threshold;
    const bool any_always = has_always(rows) || has_always(cols);
    if (rule_none && !any_always) return TileClass::Empty;
    return TileClass::Partial;
  }

  void build_mask(Range rows, Range cols, std::vector<std::uint64_t>& mask) const {
    mask.assign(std::size_t(tile_.q) * std::size_t(words_per_row_), 0);
    const Range always_before{0, rule_.regular.begin}, always_after{rule_.regular.end, rule_.tokens};
    for (std::int64_t q = rows.begin; q < rows.end; ++q) {
      std::uint64_t* row = mask.data() + std::size_t(q - rows.begin) * std::size_t(words_per_row_);
      auto fill = [&](Range keys) {
        const Range r = keys.intersect(cols);
        if (!r.empty()) set_bits(row, r.begin - cols.begin, r.end - cols.begin);
      };
      if (!rule_.is_regular(q)) {
        fill(cols);
        continue;
      }
      fill(always_before);
      fill(always_after);
      fill(rule_.reach(q));
    }
  }

  void add_partial(Range rows, Range cols, std::int64_t kt, std::vector<std::int32_t>& full,
                   std::vector<std::int32_t>& partial, std::vector<std::int32_t>& partial_ids) {
    build_mask(rows, cols, mask_);
    PlanStats& s = plan_->stats_;
    if (alignment_ == Alignment::Round) {
      // Error diffusion: make the tile full or empty, whichever keeps the running
      // surplus of kept pairs closer to zero, so the total stays within one tile of exact.
      std::int64_t kept = 0;
      for (std::uint64_t w : mask_) kept += std::popcount(w);
      const std::int64_t a = area(rows, cols);
      const std::int64_t if_full = surplus_ + (a - kept), if_empty = surplus_ - kept;
      if (std::abs(if_full) <= std::abs(if_empty)) {
        surplus_ = if_full;
        s.added_pairs += a - kept;
        s.kept_tile_area += a;
        full.push_back(std::int32_t(kt));
      } else {
        surplus_ = if_empty;
        s.removed_pairs += kept;
      }
      return;
    }
    partial.push_back(std::int32_t(kt));
    partial_ids.push_back(store_.intern(mask_));
    s.kept_tile_area += area(rows, cols);
  }

  Rule rule_;
  TileShape tile_;
  Alignment alignment_;
  std::int32_t words_per_row_;
  MaskStore store_;
  std::vector<std::uint64_t> mask_;
  std::int64_t surplus_ = 0;
  std::shared_ptr<TilePlan> plan_;
};

std::shared_ptr<const TilePlan> TilePlan::build(const VideoGrid& grid, const MaskSpec& spec, TileShape tile,
                                                Alignment alignment) {
  grid.validate();
  spec.validate(grid);
  tile.validate();
  // A cast integer would build an exact plan that alignment() and to_string() call "round".
  STSA_CHECK(alignment == Alignment::Exact || alignment == Alignment::Round, InvalidArgument,
             "alignment must be exact or round, got ", int(alignment));
  return PlanBuilder(grid, spec, tile, alignment).build();
}

}  // namespace stsa
