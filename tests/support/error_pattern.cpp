#include "support/error_pattern.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <utility>

#include "stsa/plan.hpp"

namespace stsa::testing {
namespace {

constexpr std::int64_t kSliceRows = 16;     // one warp's rows in an MMA fragment (sm80 and sm90)
constexpr std::int64_t kChannelGroup = 8;   // the accumulator fragment's column group
constexpr int kExamples = 3;                // wrong values quoted in full
constexpr std::size_t kTilesListed = 8;     // (head, query tile) pairs listed one by one

// NaN or infinity where the reference has none (or the other way round), or further than `bound`.
bool value_wrong(double got, double ref, double bound) {
  if (std::isnan(ref) || std::isnan(got)) return std::isnan(ref) != std::isnan(got);
  if (std::isinf(ref) || std::isinf(got)) return got != ref;
  return !(std::abs(got - ref) <= bound);
}

struct TileTally {
  std::int64_t wrong_rows = 0, checked_rows = 0;
};

// "0-15: 3, 16-31: 0, ..." for counts of consecutive ranges `width` wide, the last ending before `end`.
std::string ranges_line(const std::vector<std::int64_t>& counts, std::int64_t width, std::int64_t end) {
  std::ostringstream s;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    const std::int64_t first = std::int64_t(k) * width;
    s << (k ? ", " : "") << first << "-" << std::min(end, first + width) - 1 << ": " << counts[k];
  }
  return s.str();
}

// The bytes of row (b, n, h) of `t`: its whole head dim, element by element.
std::string row_bytes(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h) {
  const auto size = std::int64_t(element_size(t.dtype));
  std::string bytes;
  for (std::int64_t d = 0; d < t.head_dim(); ++d)
    bytes.append(static_cast<const char*>(t.data) + t.offset(b, n, h, d) * size, std::size_t(size));
  return bytes;
}

}  // namespace

std::string row_mismatch(const TensorView& expected, const TensorView& got, const TensorView& source) {
  std::int64_t wrong = 0, rows = 0;
  std::ostringstream first;
  for (std::int64_t b = 0; b < expected.batch(); ++b)
    for (std::int64_t n = 0; n < expected.tokens(); ++n)
      for (std::int64_t h = 0; h < expected.heads(); ++h, ++rows) {
        const std::string row = row_bytes(got, b, n, h);
        if (row == row_bytes(expected, b, n, h)) continue;
        if (++wrong > 1) continue;  // only the first wrong row is looked up in the source
        first << "the first, (batch " << b << ", token " << n << ", head " << h << "), holds ";
        bool found = false;
        for (std::int64_t sb = 0; sb < source.batch() && !found; ++sb)
          for (std::int64_t sn = 0; sn < source.tokens() && !found; ++sn)
            for (std::int64_t sh = 0; sh < source.heads() && !found; ++sh)
              if (row_bytes(source, sb, sn, sh) == row) {
                first << "source row (batch " << sb << ", token " << sn << ", head " << sh << ")";
                found = true;
              }
        if (!found) first << "no source row";
      }
  if (wrong == 0) return {};
  std::ostringstream s;
  s << wrong << " of " << rows << " rows differ; " << first.str();
  return s.str();
}

std::string error_pattern(const AttentionCall& call, const ReferenceRows& reference, double o_bound,
                          double lse_bound) {
  const VideoLayout& layout = call.layout;
  const std::int64_t dims = layout.head_dim, count = std::int64_t(reference.rows.size());
  const std::int64_t tokens = layout.tokens();
  std::int64_t values = 0, wrong_values = 0, wrong_nan = 0, pairs = 0, wrong_pairs = 0, lse_wrong = 0;
  std::vector<std::int64_t> head_wrong(std::size_t(layout.heads), 0), head_pairs(std::size_t(layout.heads), 0);
  std::vector<std::int64_t> batch_wrong(std::size_t(layout.batch), 0);
  std::vector<std::int64_t> channel_wrong(std::size_t((dims + kChannelGroup - 1) / kChannelGroup), 0);
  std::vector<std::int64_t> slice_wrong;  // by row within its query tile
  std::int64_t slice_tile = 0;            // the largest tile height seen (slices are labelled with it)
  std::map<std::pair<std::int64_t, std::int64_t>, TileTally> tiles;  // (head, query tile)
  std::ostringstream examples, lse_examples;
  int example_count = 0, lse_example_count = 0;

  for (std::int64_t h = 0; h < layout.heads; ++h) {
    const HeadMask& head = call.heads[std::size_t(h)];
    if (!head.compute) continue;
    const std::int64_t tile_q = head.plan ? head.plan->tile().q : 128;
    if (tile_q > slice_tile) {
      slice_tile = tile_q;
      slice_wrong.resize(std::size_t((tile_q + kSliceRows - 1) / kSliceRows), 0);
    }
    for (std::int64_t b = 0; b < layout.batch; ++b)
      for (std::int64_t r = 0; r < count; ++r) {
        const std::int64_t i = reference.rows[std::size_t(r)];
        const double* ref = reference.o.data() + std::size_t(((b * count + r) * layout.heads + h) * dims);
        bool row_wrong = false;
        for (std::int64_t d = 0; d < dims; ++d) {
          const double got = call.o.load(b, i, h, d);
          ++values;
          if (!value_wrong(got, ref[d], o_bound)) continue;
          row_wrong = true;
          ++wrong_values;
          if (std::isnan(got)) ++wrong_nan;
          ++channel_wrong[std::size_t(d / kChannelGroup)];
          if (example_count < kExamples)
            examples << (example_count++ ? "; " : "") << "O[b=" << b << ", i=" << i << ", h=" << h << ", d=" << d
                     << "] = " << got << ", reference " << ref[d];
        }
        if (call.lse.data) {
          const double got = call.lse.at(b, h, i);
          const double ref_l = reference.lse[std::size_t((b * layout.heads + h) * count + r)];
          if (value_wrong(got, ref_l, lse_bound)) {
            row_wrong = true;  // the row's place (tile, slice) counts for an LSE fault too
            ++lse_wrong;
            if (lse_example_count < kExamples)
              lse_examples << (lse_example_count++ ? "; " : "") << "LSE[b=" << b << ", h=" << h << ", i=" << i
                           << "] = " << got << ", reference " << ref_l;
          }
        }
        ++pairs;
        ++head_pairs[std::size_t(h)];
        TileTally& tally = tiles[{h, i / tile_q}];
        ++tally.checked_rows;
        if (!row_wrong) continue;
        ++wrong_pairs;
        ++head_wrong[std::size_t(h)];
        ++batch_wrong[std::size_t(b)];
        ++tally.wrong_rows;
        ++slice_wrong[std::size_t((i % tile_q) / kSliceRows)];
      }
  }
  if (wrong_values == 0 && lse_wrong == 0) return {};

  std::ostringstream s;
  s << "  wrong: " << wrong_values << " of " << values << " O values (" << wrong_nan << " NaN, i.e. never written or "
    << "NaN computed); LSE wrong in " << lse_wrong << " of " << pairs << "; " << wrong_pairs << " of " << pairs
    << " (batch, row, head) rows have either (O bound " << o_bound << ", LSE bound " << lse_bound
    << "); the counts below are of those rows\n";
  s << "  rows by head: ";
  for (std::int64_t h = 0, listed = 0; h < layout.heads; ++h)
    if (head_pairs[std::size_t(h)] > 0)
      s << (listed++ ? ", " : "") << "h" << h << " " << head_wrong[std::size_t(h)] << " of " << head_pairs[std::size_t(h)];
  s << "\n";
  if (layout.batch > 1) {
    s << "  rows by batch:";
    for (std::size_t b = 0; b < batch_wrong.size(); ++b) s << (b ? ", b" : " b") << b << " " << batch_wrong[b];
    s << "\n";
  }

  // Query tiles: which ones, and whether what they share (partial key tiles, the
  // ragged last tile) singles them out.
  std::int64_t wrong_tiles = 0, with_partial = 0, wrong_with_partial = 0, ragged = 0, wrong_ragged = 0;
  std::ostringstream listed;
  std::size_t listed_count = 0;
  for (const auto& [key, tally] : tiles) {
    const auto [h, tile] = key;
    const auto& plan = call.heads[std::size_t(h)].plan;
    const bool partial = plan && !plan->partial_tiles(tile).empty();
    const std::int64_t tile_q = plan ? plan->tile().q : 128;
    const bool is_ragged = (tile + 1) * tile_q > tokens;
    with_partial += partial;
    ragged += is_ragged;
    if (tally.wrong_rows == 0) continue;
    ++wrong_tiles;
    wrong_with_partial += partial;
    wrong_ragged += is_ragged;
    if (listed_count++ >= kTilesListed) continue;
    listed << "    h" << h << " tile " << tile << " (rows " << tile * tile_q << "-"
           << std::min(tokens, (tile + 1) * tile_q) - 1 << (is_ragged ? ", the ragged last tile" : "") << "): "
           << tally.wrong_rows << " of " << tally.checked_rows << " checked rows wrong";
    if (plan)
      listed << "; its plan row: " << plan->full_tiles(tile).size() << " full, " << plan->partial_tiles(tile).size()
             << " partial key tiles";
    listed << "\n";
  }
  s << "  query tiles: " << wrong_tiles << " of " << tiles.size() << " (head, tile) pairs have wrong rows; with "
    << "partial key tiles: " << wrong_with_partial << " of the wrong, " << with_partial << " of all; the ragged "
    << "last tile: " << wrong_ragged << " of the wrong, " << ragged << " of all\n"
    << listed.str();
  if (listed_count > kTilesListed) s << "    (+" << listed_count - kTilesListed << " more)\n";
  s << "  rows by place in their tile (16-row warp slices): " << ranges_line(slice_wrong, kSliceRows, slice_tile)
    << "\n";
  s << "  O values by channel (8-wide groups): " << ranges_line(channel_wrong, kChannelGroup, dims) << "\n";
  if (example_count) s << "  first wrong: " << examples.str() << "\n";
  if (lse_example_count) s << "  first wrong LSE: " << lse_examples.str() << "\n";
  return s.str();
}

}  // namespace stsa::testing
