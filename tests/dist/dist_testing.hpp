// Helpers shared by the distributed tests: cut one rank's shard out of a
// full-sequence problem, and compare a rank's outputs with the single-device
// outputs row by row, bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "dist/row_copy.hpp"
#include "stsa/dist.hpp"
#include "support/testing.hpp"

namespace stsa::dist_testing {

inline VideoLayout make_layout(VideoGrid grid, std::int64_t heads, std::int64_t dim, std::int64_t batch = 1) {
  return VideoLayout{grid, batch, heads, dim};
}

// Cycles spatial, temporal, frame-window and dense heads (the per-head masks a router would pick).
inline std::vector<MaskSpec> mixed_masks(const VideoGrid& grid, std::int64_t heads, double density) {
  std::vector<MaskSpec> masks;
  for (std::int64_t h = 0; h < heads; ++h) {
    switch (h % 4) {
      case 0: masks.push_back(mask_for_density(grid, SparseKind::Spatial, density)); break;
      case 1: masks.push_back(mask_for_density(grid, SparseKind::Temporal, density)); break;
      case 2: masks.push_back(mask_for_density(grid, SparseKind::FrameWindow, density)); break;
      default: masks.push_back(MaskSpec::dense()); break;
    }
  }
  return masks;
}

// Masks as the reference sees them: per head, on frame-major tensors, no plan (it evaluates the predicate).
inline std::vector<HeadMask> reference_heads(const VideoLayout& layout, const std::vector<MaskSpec>& masks) {
  std::vector<HeadMask> heads;
  for (std::int64_t h = 0; h < layout.heads; ++h)
    heads.push_back(HeadMask{masks.size() == 1 ? masks[0] : masks[std::size_t(h)], TokenOrder::FrameMajor, nullptr, true});
  return heads;
}

// The single-device baseline: the routed path on the whole problem with the given masks.
inline RoutedResult run_single(const stsa::testing::Problem& p, const std::vector<MaskSpec>& masks, bool with_lse,
                               const Backend& backend, PlanCache& plans) {
  RoutedCall call{p.layout, p.q.view(), p.k.view(), p.v.view(), p.o.view(), with_lse ? p.lse.view() : LseView{}};
  call.descales = p.call().descales;  // views of p's own factors
  return run_routed(backend, plans, call, dist::routes_for_masks(masks, p.layout.heads));
}

// Copies tokens [first, first + count) of `from` into tokens [0, count) of `to`.
inline void copy_tokens(const TensorView& from, std::int64_t first, std::int64_t count, const TensorView& to) {
  std::vector<std::byte> row(dist::detail::row_bytes(from));
  for (std::int64_t b = 0; b < from.batch(); ++b)
    for (std::int64_t i = 0; i < count; ++i)
      for (std::int64_t h = 0; h < from.heads(); ++h) {
        dist::detail::read_row(from, b, first + i, h, row.data());
        dist::detail::write_row(to, b, i, h, row.data());
      }
}

// A [B, count, H, D] view: owned storage when count > 0, a null view with the right shape otherwise.
// Poisoned as ShardLse is (0xFF bytes: NaN in every float type), so an output row never written shows.
class ShardTensor {
 public:
  ShardTensor(DType dtype, std::int64_t batch, std::int64_t count, std::int64_t heads, std::int64_t dim) {
    if (count > 0) {
      tensor_ = Tensor(dtype, batch, count, heads, dim);
      view_ = tensor_.view();
      std::memset(view_.data, 0xFF, tensor_.bytes());
      return;
    }
    view_.dtype = dtype;
    view_.shape = {batch, 0, heads, dim};
    view_.stride = {0, heads * dim, dim, 1};
  }
  // view_ points into tensor_: a copy would point at the original's bytes.
  ShardTensor(const ShardTensor&) = delete;
  ShardTensor& operator=(const ShardTensor&) = delete;
  ShardTensor(ShardTensor&&) noexcept = default;
  ShardTensor& operator=(ShardTensor&&) noexcept = default;
  TensorView view() const { return view_; }

 private:
  Tensor tensor_;
  TensorView view_;
};

class ShardLse {
 public:
  ShardLse(std::int64_t batch, std::int64_t heads, std::int64_t count) {
    storage_.assign(std::size_t(std::max<std::int64_t>(batch * heads * count, 1)), std::nanf(""));
    view_.data = storage_.data();
    view_.shape = {batch, heads, count};
    view_.stride = {heads * count, count, 1};
  }
  ShardLse(const ShardLse&) = delete;  // as ShardTensor
  ShardLse& operator=(const ShardLse&) = delete;
  ShardLse(ShardLse&&) noexcept = default;
  ShardLse& operator=(ShardLse&&) noexcept = default;
  LseView view() const { return view_; }

 private:
  std::vector<float> storage_;
  LseView view_;
};

// One rank's inputs and outputs for a full-sequence problem.
struct RankProblem {
  dist::Shard shard;
  ShardTensor q, k, v, o;
  ShardLse lse;
  ShardTensor text_q, text_k, text_v, text_o;
  ShardLse text_lse;
  dist::UlyssesCall call;
};

inline RankProblem shard_problem(const stsa::testing::Problem& p, const std::vector<MaskSpec>& masks, int ranks,
                                 int rank, bool with_lse) {
  const VideoLayout& l = p.layout;
  const VideoGrid& g = l.grid;
  const dist::Shard s = dist::sequence_shard(g.video_tokens(), ranks, rank);
  const std::int64_t t = g.text_tokens, text_begin = g.text_placement == TextPlacement::Before ? 0 : g.video_end();
  const DType in = p.q.dtype(), out = p.o.view().dtype;
  const std::int64_t kv = p.k.view().heads();  // fewer than l.heads for grouped-query attention
  RankProblem r{s,
                ShardTensor(in, l.batch, s.count, l.heads, l.head_dim),
                ShardTensor(in, l.batch, s.count, kv, l.head_dim),
                ShardTensor(in, l.batch, s.count, kv, l.head_dim),
                ShardTensor(out, l.batch, s.count, l.heads, l.head_dim),
                ShardLse(l.batch, l.heads, s.count),
                ShardTensor(in, l.batch, t, l.heads, l.head_dim),
                ShardTensor(in, l.batch, t, kv, l.head_dim),
                ShardTensor(in, l.batch, t, kv, l.head_dim),
                ShardTensor(out, l.batch, t, l.heads, l.head_dim),
                ShardLse(l.batch, l.heads, t),
                {}};
  copy_tokens(p.q.view(), g.video_begin() + s.begin, s.count, r.q.view());
  copy_tokens(p.k.view(), g.video_begin() + s.begin, s.count, r.k.view());
  copy_tokens(p.v.view(), g.video_begin() + s.begin, s.count, r.v.view());
  copy_tokens(p.q.view(), text_begin, t, r.text_q.view());
  copy_tokens(p.k.view(), text_begin, t, r.text_k.view());
  copy_tokens(p.v.view(), text_begin, t, r.text_v.view());
  dist::UlyssesCall& c = r.call;
  c.layout = l;
  c.q = r.q.view();
  c.k = r.k.view();
  c.v = r.v.view();
  c.o = r.o.view();
  if (with_lse) c.lse = r.lse.view();
  if (t > 0) {
    c.text_q = r.text_q.view();
    c.text_k = r.text_k.view();
    c.text_v = r.text_v.view();
    c.text_o = r.text_o.view();
    if (with_lse) c.text_lse = r.text_lse.view();
  }
  c.masks = masks;
  c.descales = p.call().descales;  // every rank holds all B x H factors (views of p's)
  return r;
}

struct RowDiff {
  double max_abs = 0;      // largest |a - b| over compared values (NaN counts as infinite)
  std::int64_t differing_bits = 0;  // values whose bits differ
};

// Tokens [0, count) of `a` against tokens [first, first + count) of `b`, every head.
inline RowDiff compare_tokens(const TensorView& a, const TensorView& b, std::int64_t first, std::int64_t count) {
  RowDiff d;
  for (std::int64_t bb = 0; bb < a.batch(); ++bb)
    for (std::int64_t i = 0; i < count; ++i)
      for (std::int64_t h = 0; h < a.heads(); ++h)
        for (std::int64_t c = 0; c < a.head_dim(); ++c) {
          const float x = a.load(bb, i, h, c), y = b.load(bb, first + i, h, c);
          if (std::memcmp(&x, &y, sizeof x) != 0) ++d.differing_bits;
          const double diff = std::isnan(x) || std::isnan(y) ? INFINITY : std::abs(double(x) - double(y));
          d.max_abs = std::max(d.max_abs, diff);
        }
  return d;
}

inline RowDiff compare_lse(const LseView& a, const LseView& b, std::int64_t first, std::int64_t count) {
  RowDiff d;
  for (std::int64_t bb = 0; bb < a.shape[0]; ++bb)
    for (std::int64_t h = 0; h < a.shape[1]; ++h)
      for (std::int64_t i = 0; i < count; ++i) {
        const float x = a.at(bb, h, i), y = b.at(bb, h, first + i);
        if (std::memcmp(&x, &y, sizeof x) != 0) ++d.differing_bits;
        const double diff = std::isnan(x) || std::isnan(y) ? INFINITY
                            : x == y                       ? 0.0
                                                           : std::abs(double(x) - double(y));
        d.max_abs = std::max(d.max_abs, diff);
      }
  return d;
}

}  // namespace stsa::dist_testing
