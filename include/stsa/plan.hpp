// Tile plans: the mask of one head, classified per (query tile, key tile).
//
// Every tile of the N x N attention matrix is
//   Empty   - no allowed pair; never listed, its K/V are never loaded;
//   Full    - every pair inside the matrix is allowed; no mask work at all;
//   Partial - some pairs are allowed; carries an element bitmask.
// Per query tile the plan lists its full key tiles, then its partial key tiles
// (CSR). Partial bitmasks are deduplicated. A plan is immutable and is shared by
// every head (layer, step) with the same grid, spec, tile shape and alignment.
// Plans index tokens in the spec's natural order: a temporal head's tensors must
// be permuted to spatial-major order before a tiled backend runs it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "stsa/layout.hpp"
#include "stsa/mask.hpp"

namespace stsa {

enum class TileClass : std::uint8_t { Empty, Full, Partial };
enum class Alignment : std::uint8_t { Exact, Round };

std::string_view to_string(Alignment a);
Alignment parse_alignment(std::string_view name);  // "exact" | "round"

struct TileShape {
  std::int32_t q = 128;  // query rows per tile
  std::int32_t k = 128;  // key columns per tile
  void validate() const;  // 1 <= q <= 1024; k a multiple of 64 in [64, 1024] (bitmask rows are whole words)
  bool operator==(const TileShape&) const = default;
};

struct PlanStats {
  std::int64_t tiles_full = 0;
  std::int64_t tiles_partial = 0;
  std::int64_t tiles_empty = 0;
  std::int64_t total_pairs = 0;        // N * N
  std::int64_t exact_kept_pairs = 0;   // allowed pairs of the spec
  std::int64_t kept_pairs = 0;         // pairs the plan computes (differs from exact only when rounded)
  std::int64_t changed_pairs = 0;      // pairs whose allowed-ness rounding flipped
  std::int64_t added_pairs = 0;        // rounding: partial tiles made full
  std::int64_t removed_pairs = 0;      // rounding: partial tiles made empty
  std::int64_t kept_tile_area = 0;     // pairs inside full + partial tiles (what a tiled kernel computes)
  std::int64_t distinct_masks = 0;
  double build_ms = 0.0;
  std::int64_t plan_bytes = 0;

  double tile_density() const;  // (full + partial) / all tiles
  double kept_fraction() const { return total_pairs ? double(kept_pairs) / double(total_pairs) : 0.0; }
};

class TilePlan {
 public:
  // Builds analytically from the spec (O(kept tiles) work, no N x N matrix). InvalidArgument for an
  // invalid grid, spec, tile or alignment; ResourceError, before building, for one too large to hold.
  static std::shared_ptr<const TilePlan> build(const VideoGrid& grid, const MaskSpec& spec,
                                               TileShape tile = {}, Alignment alignment = Alignment::Exact);

  const VideoGrid& grid() const { return grid_; }
  const MaskSpec& spec() const { return spec_; }
  TokenOrder order() const { return spec_.natural_order(); }
  TileShape tile() const { return tile_; }
  Alignment alignment() const { return alignment_; }
  std::int64_t tokens() const { return grid_.tokens(); }
  std::int64_t q_tiles() const { return q_tiles_; }
  std::int64_t k_tiles() const { return k_tiles_; }
  const PlanStats& stats() const { return stats_; }

  // Row q_tile of the CSR; InvalidArgument outside [0, q_tiles()).
  std::span<const std::int32_t> full_tiles(std::int64_t q_tile) const;
  std::span<const std::int32_t> partial_tiles(std::int64_t q_tile) const;
  std::span<const std::int32_t> partial_mask_ids(std::int64_t q_tile) const;  // parallel to partial_tiles()

  // Bitmask of a partial tile: tile().q rows of mask_words_per_row() words;
  // bit c of row r says whether query q0 + r may see key k0 + c. Bits outside the
  // matrix (ragged last tiles) are 0.
  std::int32_t mask_words_per_row() const { return tile_.k / 64; }
  const std::uint64_t* mask(std::int32_t id) const;  // InvalidArgument outside [0, stats().distinct_masks)

  TileClass classify(std::int64_t q_tile, std::int64_t k_tile) const;  // binary search in the CSR row
  // What a backend following the plan does; InvalidArgument for a position outside [0, tokens()).
  bool computes(std::int64_t q_pos, std::int64_t k_pos) const;

  // Throws InvalidArgument unless this plan fits the grid, the head's spec and token order.
  void check_matches(const VideoGrid& grid, const MaskSpec& spec, TokenOrder tensor_order) const;

  // Rebuilds nothing; checks the CSR structure: rows ascending, every key tile in range, mask ids
  // in range, counts as in stats(). O(kept tiles). Neither this nor check_matches compares the
  // mask bits with the spec (check_matches compares the specs; the tests compare the bits).
  void self_check() const;

 private:
  TilePlan() = default;
  friend class PlanBuilder;

  VideoGrid grid_;
  MaskSpec spec_;
  TileShape tile_;
  Alignment alignment_ = Alignment::Exact;
  std::int64_t q_tiles_ = 0;
  std::int64_t k_tiles_ = 0;
  std::vector<std::int64_t> row_begin_;      // q_tiles + 1 offsets into key_tiles_
  std::vector<std::int64_t> partial_begin_;  // q_tiles: first partial entry of each row
  std::vector<std::int32_t> key_tiles_;      // full ones then partial ones, ascending within each group
  std::vector<std::int32_t> mask_ids_;       // parallel to key_tiles_; -1 for full entries
  std::vector<std::uint64_t> masks_;         // distinct masks, tile_.q * words_per_row each
  PlanStats stats_;
};

// Thread-safe cache of plans keyed by value (grid, spec, tile, alignment).
class PlanCache {
 public:
  std::shared_ptr<const TilePlan> get(const VideoGrid& grid, const MaskSpec& spec, TileShape tile = {},
                                      Alignment alignment = Alignment::Exact);
  std::size_t size() const;
  void clear();

 private:
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<const TilePlan>> plans_;
};

}  // namespace stsa
