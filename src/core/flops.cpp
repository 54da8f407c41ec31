#include "stsa/flops.hpp"

namespace stsa {

double attention_flops(std::int64_t pairs, std::int64_t head_dim) { return 4.0 * double(pairs) * double(head_dim); }

double dense_attention_flops(const VideoLayout& layout) {
  const double n = double(layout.tokens());
  return 4.0 * n * n * double(layout.head_dim) * double(layout.batch * layout.heads);
}

double kept_tile_flops(const VideoLayout& layout, const TilePlan& plan) {
  return attention_flops(plan.stats().kept_tile_area, layout.head_dim) * double(layout.batch * layout.heads);
}

double kept_pair_flops(const VideoLayout& layout, const TilePlan& plan) {
  return attention_flops(plan.stats().kept_pairs, layout.head_dim) * double(layout.batch * layout.heads);
}

double permutation_bytes(const VideoLayout& layout, std::int64_t heads, int tensors, std::size_t element_bytes) {
  return 2.0 * double(tensors) * double(layout.batch) * double(layout.tokens()) * double(heads) *
         double(layout.head_dim) * double(element_bytes);
}

}  // namespace stsa
