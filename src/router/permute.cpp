#include "stsa/permute.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "router/parallel.hpp"
#include "router/permute_checks.hpp"
#include "stsa/cpu.hpp"
#include "stsa/attention.hpp"
#include "stsa/error.hpp"

namespace stsa {
namespace {

constexpr double kBytesPerThread = 4.0 * (1 << 20);  // below this, extra threads cost more than they save

// Heads in range; distinct where they are written (a scatter's). A gather may read a
// head twice: grouped-query attention's K/V head serves several query heads.
void check_heads(std::span<const std::int64_t> heads, std::int64_t total, bool distinct) {
  std::vector<bool> seen(std::size_t(std::max<std::int64_t>(total, 0)), false);
  for (std::int64_t h : heads) {
    STSA_CHECK(h >= 0 && h < total, InvalidArgument, "permutation head index ", h, " out of range [0, ", total, ")");
    STSA_CHECK(!distinct || !seen[std::size_t(h)], InvalidArgument, "permutation head index ", h, " listed twice");
    seen[std::size_t(h)] = true;
  }
}

// `batch`: the first pair's; one pass copies that many batch entries of every pair.
void check_pair(const char* what, std::size_t i, const VideoGrid& grid, const TensorView& full,
                const TensorView& packed, std::int64_t packed_heads, std::int64_t batch) {
  STSA_CHECK(full.data != nullptr && packed.data != nullptr, InvalidArgument, what, " tensor ", i, " is null");
  STSA_CHECK(full.batch() == batch, InvalidArgument, what, " tensor ", i, " has batch ", full.batch(),
             ", tensor 0 has ", batch);
  STSA_CHECK(full.dtype == packed.dtype, InvalidArgument, what, " tensor ", i, ": dtypes differ (",
             to_string(full.dtype), " vs ", to_string(packed.dtype), "); a permutation copies bits");
  STSA_CHECK(full.tokens() == grid.tokens() && packed.tokens() == grid.tokens(), InvalidArgument, what, " tensor ", i,
             ": token counts ", full.tokens(), " / ", packed.tokens(), " do not match the grid ", grid.describe(),
             " (", grid.tokens(), " tokens)");
  STSA_CHECK(full.batch() == packed.batch() && full.head_dim() == packed.head_dim() && full.batch() >= 1 &&
                 full.head_dim() >= 1,
             InvalidArgument, what, " tensor ", i, ": batch/head dim differ (", full.batch(), "x", full.head_dim(),
             " vs ", packed.batch(), "x", packed.head_dim(), ")");
  STSA_CHECK(packed.heads() == packed_heads, InvalidArgument, what, " tensor ", i, ": packed tensor has ",
             packed.heads(), " heads, expected ", packed_heads);
  for (int d = 0; d < 4; ++d)
    STSA_CHECK(full.stride[d] >= 0 && packed.stride[d] >= 0, InvalidArgument, what, " tensor ", i,
               ": negative strides are not supported");
  if (packed_heads > 0)
    STSA_CHECK(!extents_overlap(full.byte_extent(), packed.byte_extent()), InvalidArgument, what, " tensor ", i,
               ": source and destination overlap");
}

// What a permutation writes: each destination's elements at distinct, aligned
// addresses, and no destination over another pair's source or another destination
// (one pass copies every pair, so such a byte would be read after it was written,
// or keep one of two values). A scatter's LSE rows move in that pass too.
void check_destinations(const char* what, std::span<const TensorView> sources, std::span<const TensorView> dests,
                        const LseView& source_lse = {}, const LseView& dest_lse = {}) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < dests.size(); ++i) names.push_back(detail::concat("destination ", i));
  for (std::size_t i = 0; i < sources.size(); ++i) names.push_back(detail::concat("source ", i));
  std::vector<NamedExtent> outputs, inputs;
  for (std::size_t i = 0; i < dests.size(); ++i) {
    validate_view_memory(detail::concat(what, " ", names[i]).c_str(), dests[i]);
    outputs.push_back(NamedExtent::of(names[i], dests[i]));
  }
  for (std::size_t i = 0; i < sources.size(); ++i) inputs.push_back(NamedExtent::of(names[dests.size() + i], sources[i]));
  if (dest_lse.data != nullptr) outputs.push_back(NamedExtent::of("LSE destination", dest_lse));
  if (source_lse.data != nullptr) inputs.push_back(NamedExtent::of("LSE source", source_lse));
  check_outputs_apart(detail::concat(what, " "), outputs, inputs);
}

// Copies `bytes` (a multiple of 64) as 64-byte pieces the compiler turns into
// plain vector moves: for the few-hundred-byte head slices of a permutation this
// is measurably faster than a call to the library memcpy (which dispatches on
// size and alignment on every call).
inline void copy_lines(std::byte* __restrict d, const std::byte* __restrict s, std::size_t bytes) {
  for (std::size_t o = 0; o < bytes; o += 64) std::memcpy(d + o, s + o, 64);
}

// One tensor pair of a permutation with its byte strides, and the heads cut into
// runs that are adjacent in both tensors, so each (token, run) is one memcpy of
// run * D elements: the copy loop does no per-element index arithmetic.
struct CopyPlan {
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;
  std::int64_t src_batch = 0, src_token = 0, dst_batch = 0, dst_token = 0;  // byte strides
  struct Run {
    std::int64_t src_offset, dst_offset, heads;
  };
  std::vector<Run> runs;
  std::size_t run_bytes_per_head = 0;  // D * element size when channels are contiguous, else 0
  std::int64_t elem = 0, dim = 0, src_channel = 0, dst_channel = 0, src_head = 0, dst_head = 0;

  // src_heads[j] of `src` -> dst_heads[j] of `dst`.
  CopyPlan(const TensorView& from, std::span<const std::int64_t> src_heads, const TensorView& to,
           std::span<const std::int64_t> dst_heads)
      : src(static_cast<const std::byte*>(from.data)), dst(static_cast<std::byte*>(to.data)) {
    elem = std::int64_t(element_size(from.dtype));
    dim = from.head_dim();
    src_batch = from.stride[0] * elem, src_token = from.stride[1] * elem, src_head = from.stride[2] * elem;
    dst_batch = to.stride[0] * elem, dst_token = to.stride[1] * elem, dst_head = to.stride[2] * elem;
    src_channel = from.stride[3] * elem, dst_channel = to.stride[3] * elem;
    const bool contiguous = from.stride[3] == 1 && to.stride[3] == 1;
    if (contiguous) run_bytes_per_head = std::size_t(dim * elem);
    for (std::size_t j = 0; j < src_heads.size(); ++j) {
      const bool extends = contiguous && !runs.empty() && src_heads[j] == src_heads[j - 1] + 1 &&
                           dst_heads[j] == dst_heads[j - 1] + 1 && from.stride[2] == dim && to.stride[2] == dim;
      if (extends) ++runs.back().heads;
      else runs.push_back({src_heads[j] * src_head, dst_heads[j] * dst_head, 1});
    }
  }

  void copy(std::int64_t b, std::int64_t from_token, std::int64_t to_token) const {
    const std::byte* s = src + b * src_batch + from_token * src_token;
    std::byte* d = dst + b * dst_batch + to_token * dst_token;
    for (const Run& r : runs) {
      if (run_bytes_per_head != 0) {
        const std::size_t bytes = run_bytes_per_head * std::size_t(r.heads);
        if (bytes % 64 == 0) copy_lines(d + r.dst_offset, s + r.src_offset, bytes);
        else std::memcpy(d + r.dst_offset, s + r.src_offset, bytes);
        continue;
      }
      for (std::int64_t c = 0; c < dim; ++c)  // strided channels: element by element
        std::memcpy(d + r.dst_offset + c * dst_channel, s + r.src_offset + c * src_channel, std::size_t(elem));
    }
  }
};

int pick_threads(int threads, double bytes) {
  if (threads > 0) return threads;
  return int(std::clamp<double>(bytes / kBytesPerThread, 1.0, double(resolve_threads(0))));
}

}  // namespace

std::vector<std::int64_t> permutation_map(const VideoGrid& grid, TokenOrder from, TokenOrder to) {
  grid.validate();
  check_token_order("permutation map: ", from);
  check_token_order("permutation map: ", to);
  std::vector<std::int64_t> map(std::size_t(grid.tokens()));
  for (std::int64_t n = 0; n < grid.tokens(); ++n) map[std::size_t(n)] = grid.position(grid.coord(n, to), from);
  return map;
}

namespace router_detail {

void check_permutation(const char* what, const VideoGrid& grid, std::span<const std::int64_t> heads,
                       std::span<const TensorView> full, std::span<const TensorView> packed, bool gather,
                       const LseView& packed_lse, const LseView& lse) {
  grid.validate();
  STSA_CHECK(full.size() == packed.size(), InvalidArgument, what, ": ", full.size(), " full tensors but ",
             packed.size(), " packed ones");
  const std::int64_t count = std::int64_t(heads.size());
  for (std::size_t i = 0; i < full.size(); ++i) {
    check_pair(what, i, grid, full[i], packed[i], count, full[0].batch());
    check_heads(heads, full[i].heads(), /*distinct=*/!gather);
  }
  STSA_CHECK((packed_lse.data == nullptr) == (lse.data == nullptr), InvalidArgument, what,
             ": give both LSE views or neither");
  if (lse.data != nullptr) {
    const std::int64_t batch = full.empty() ? lse.shape[0] : full[0].batch();
    STSA_CHECK(packed_lse.shape[0] == batch && lse.shape[0] == batch && packed_lse.shape[1] == count &&
                   packed_lse.shape[2] == grid.tokens() && lse.shape[2] == grid.tokens(),
               InvalidArgument, what, ": LSE shapes [", packed_lse.shape[0], ", ", packed_lse.shape[1], ", ",
               packed_lse.shape[2], "] -> [", lse.shape[0], ", ", lse.shape[1], ", ", lse.shape[2],
               "] do not match B=", batch, ", Ht=", count, ", N=", grid.tokens());
    check_heads(heads, lse.shape[1], /*distinct=*/true);
    for (int d = 0; d < 3; ++d)
      STSA_CHECK(packed_lse.stride[d] >= 0 && lse.stride[d] >= 0, InvalidArgument, what,
                 ": negative LSE strides are not supported");
    if (count > 0) {
      STSA_CHECK(!extents_overlap(packed_lse.byte_extent(), lse.byte_extent()), InvalidArgument, what,
                 ": LSE source and destination overlap");
      validate_lse_memory(detail::concat(what, ": LSE destination").c_str(), lse);
    }
  }
  // After the LSE checks: the views' extents are only computed for valid strides.
  if (count > 0)
    check_destinations(what, gather ? full : packed, gather ? packed : full, packed_lse, lse);
}

}  // namespace router_detail

void gather_heads(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
                  std::span<const TensorView> sources, std::span<const TensorView> packed, int threads) {
  router_detail::check_permutation("gather", grid, heads, sources, packed, /*gather=*/true);
  const std::int64_t count = std::int64_t(heads.size());
  if (count == 0 || sources.empty()) return;
  const std::vector<std::int64_t> map = permutation_map(grid, from, to);
  const std::int64_t n = grid.tokens(), batch = sources[0].batch();
  double bytes = 0;
  for (const auto& s : sources) bytes += 2.0 * double(s.batch() * n * count * s.head_dim()) * double(element_size(s.dtype));
  std::vector<std::int64_t> packed_heads(static_cast<std::size_t>(count));
  std::iota(packed_heads.begin(), packed_heads.end(), std::int64_t(0));
  std::vector<CopyPlan> plans;
  for (std::size_t i = 0; i < sources.size(); ++i) plans.emplace_back(sources[i], heads, packed[i], packed_heads);
  // One pass: every destination token pulls all its heads of every tensor; each
  // thread writes one contiguous range of destination tokens.
  router_detail::parallel_for(batch * n, pick_threads(threads, bytes), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t row = begin; row < end; ++row) {
      const std::int64_t b = row / n, to_pos = row % n, from_pos = map[std::size_t(to_pos)];
      for (const CopyPlan& p : plans) p.copy(b, from_pos, to_pos);
    }
  });
}

void scatter_heads(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
                   std::span<const TensorView> packed, std::span<const TensorView> dests, const LseView& packed_lse,
                   const LseView& lse, int threads) {
  router_detail::check_permutation("scatter", grid, heads, dests, packed, /*gather=*/false, packed_lse, lse);
  const std::int64_t count = std::int64_t(heads.size());
  const bool with_lse = lse.data != nullptr;
  const std::int64_t batch = !packed.empty() ? packed[0].batch() : with_lse ? lse.shape[0] : 0;
  if (count == 0 || batch == 0) return;
  const std::vector<std::int64_t> map = permutation_map(grid, from, to);  // packed position of each destination token
  const std::int64_t n = grid.tokens();
  double bytes = 0;
  for (const auto& p : packed) bytes += 2.0 * double(p.batch() * n * count * p.head_dim()) * double(element_size(p.dtype));
  std::vector<std::int64_t> packed_heads(static_cast<std::size_t>(count));
  std::iota(packed_heads.begin(), packed_heads.end(), std::int64_t(0));
  std::vector<CopyPlan> plans;
  for (std::size_t i = 0; i < packed.size(); ++i) plans.emplace_back(packed[i], packed_heads, dests[i], heads);
  router_detail::parallel_for(batch * n, pick_threads(threads, bytes), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t row = begin; row < end; ++row) {
      const std::int64_t b = row / n, to_pos = row % n, from_pos = map[std::size_t(to_pos)];
      for (const CopyPlan& p : plans) p.copy(b, from_pos, to_pos);
      if (with_lse)
        for (std::int64_t j = 0; j < count; ++j) lse.at(b, heads[std::size_t(j)], to_pos) = packed_lse.at(b, j, from_pos);
    }
  });
}

double measure_copy_gbps(std::size_t bytes, int threads) {
  STSA_CHECK(bytes >= 4096, InvalidArgument, "copy bandwidth buffer must be >= 4096 bytes, got ", bytes);
  check_host_allocation(2 * std::uint64_t(bytes), "copy bandwidth measurement");
  if (threads <= 0) threads = resolve_threads(0);
  std::unique_ptr<std::byte[]> src(new std::byte[bytes]), dst(new std::byte[bytes]);
  std::memset(src.get(), 1, bytes);
  std::memset(dst.get(), 0, bytes);  // touch every page before timing
  double best = 1e30;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    router_detail::parallel_for(threads, threads, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t t = begin; t < end; ++t) {
        const std::size_t lo = bytes * std::size_t(t) / std::size_t(threads);
        const std::size_t hi = bytes * std::size_t(t + 1) / std::size_t(threads);
        std::memcpy(dst.get() + lo, src.get() + lo, hi - lo);
      }
    });
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * double(bytes) / best / 1e9;
}

}  // namespace stsa
