#include "stsa/attention.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "stsa/error.hpp"

namespace stsa {

namespace {

// Distinct elements have distinct addresses when, the dimensions sorted by stride,
// each stride steps over everything the smaller ones span: the first dimension
// that does not (its span so far in `span_below`), or none. Non-negative strides.
template <std::size_t Rank>
std::optional<std::size_t> overlapping_dimension(const std::array<std::int64_t, Rank>& shape,
                                                 const std::array<std::int64_t, Rank>& stride,
                                                 std::int64_t* span_below = nullptr) {
  std::array<std::size_t, Rank> order{};
  for (std::size_t i = 0; i < Rank; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return stride[a] < stride[b]; });
  std::int64_t span = 1;
  for (const std::size_t i : order) {
    if (shape[i] == 1) continue;
    if (stride[i] < span) {
      if (span_below != nullptr) *span_below = span;
      return i;
    }
    // Saturates: a dimension past a span this wide has already failed byte_extent().
    if (__builtin_mul_overflow(stride[i], shape[i], &span)) span = std::numeric_limits<std::int64_t>::max();
  }
  return std::nullopt;
}

template <std::size_t Rank>
void check_distinct_addresses(const char* name, const std::array<std::int64_t, Rank>& shape,
                              const std::array<std::int64_t, Rank>& stride) {
  for (std::size_t i = 0; i < Rank; ++i)
    STSA_CHECK(stride[i] >= 0, InvalidArgument, name, " has negative stride ", stride[i], " in dimension ", i);
  std::int64_t span = 0;
  const std::optional<std::size_t> bad = overlapping_dimension(shape, stride, &span);
  STSA_CHECK(!bad, InvalidArgument, name, " has overlapping strides (dimension ", bad.value_or(0), " stride ",
             stride[bad.value_or(0)], " < ", span, ")");
}

// Whether a and b (both with their shapes) are disjoint index ranges of one
// dimension of a view with their strides, under which no two elements share an
// address: then no byte of one is a byte of the other. False where that cannot be
// shown (other element sizes or strides, any other interleaving).
bool disjoint_slices_of_one_view(const NamedExtent& a, const NamedExtent& b) {
  if (a.element_bytes == 0 || a.element_bytes != b.element_bytes) return false;
  for (std::size_t k = 0; k < 4; ++k)  // (a dimension of one element in both may have any stride)
    if (a.stride[k] != b.stride[k] && (a.shape[k] > 1 || b.shape[k] > 1)) return false;
  // Both are aligned to the element (validated), so their offset is a whole number of elements.
  const auto delta = std::int64_t(reinterpret_cast<std::uintptr_t>(b.bytes.first) -
                                  reinterpret_cast<std::uintptr_t>(a.bytes.first));
  if (delta % std::int64_t(a.element_bytes) != 0) return false;
  const std::int64_t offset = delta / std::int64_t(a.element_bytes);  // b's first element from a's
  for (std::size_t k = 0; k < 4; ++k) {
    if (a.stride[k] <= 0 || offset % a.stride[k] != 0) continue;
    bool others_equal = true;
    for (std::size_t j = 0; j < 4; ++j) others_equal &= j == k || a.shape[j] == b.shape[j];
    if (!others_equal) continue;
    const std::int64_t t = offset / a.stride[k];  // b's range along k: [t, t + b.shape[k])
    std::int64_t b_end = 0;
    if (__builtin_add_overflow(t, b.shape[k], &b_end) || !(t >= a.shape[k] || b_end <= 0)) continue;
    std::array<std::int64_t, 4> both = a.shape;  // the view spanning both ranges
    if (__builtin_sub_overflow(std::max(a.shape[k], b_end), std::min<std::int64_t>(0, t), &both[k])) continue;
    if (!overlapping_dimension(both, a.stride)) return true;
  }
  return false;
}

// A view's byte_extent(), its error naming the view as every other check of validate() does.
template <class View>
void named_extent(const char* name, const View& view) {
  try {
    view.byte_extent();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(detail::concat(name, ": ", e.what()));
  }
}

bool is_token_order(TokenOrder order) { return order == TokenOrder::FrameMajor || order == TokenOrder::SpatialMajor; }

// Whether t is one of DType's values (a cast integer may be none: its element size and conversions are made up).
bool is_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F8E4M3; }

// What a scattered output and a gathered input (`what`, its tensors' `side`)
// both check: the grid, the token orders, the call's computed heads in `order`.
void check_grid_and_orders(const AttentionCall& call, const char* what, const char* side, const VideoGrid& grid,
                           TokenOrder from, TokenOrder to, TokenOrder order) {
  STSA_CHECK(grid == call.layout.grid, InvalidArgument, what, ": the ", side, " grid ", grid.describe(),
             " is not the call's ", call.layout.grid.describe());
  STSA_CHECK(is_token_order(from) && is_token_order(to), InvalidArgument, what,
             ": the token orders are not TokenOrder values");
  for (std::size_t h = 0; h < call.heads.size(); ++h)
    STSA_CHECK(!call.heads[h].compute || call.heads[h].order == order, InvalidArgument, what, ": head ", h,
               "'s tokens are in ", to_string(call.heads[h].order), " order, the ", side, " says ", to_string(order));
}

// And their head maps: one of the `side`'s heads per head of the call, each in [0, limit) and listed once.
void check_head_map(const char* what, const char* side, std::span<const std::int64_t> heads, std::int64_t count,
                    std::int64_t limit) {
  STSA_CHECK(std::int64_t(heads.size()) == count, InvalidArgument, what, ": ", heads.size(), " ", side,
             " heads for ", count, " heads");
  for (const std::int64_t h : heads)
    STSA_CHECK(h >= 0 && h < limit, InvalidArgument, what, ": ", side, " head ", h, " out of range [0, ", limit, ")");
  std::vector<std::int64_t> sorted(heads.begin(), heads.end());
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  STSA_CHECK(twice == sorted.end(), InvalidArgument, what, ": ", side, " head ", twice == sorted.end() ? 0 : *twice,
             " listed twice");
}

// What no output may lie over: Q, K, V and the descales.
std::array<NamedExtent, 6> input_extents(const AttentionCall& call) {
  return {NamedExtent::of("q", call.q),
          NamedExtent::of("k", call.k),
          NamedExtent::of("v", call.v),
          {"q_descale", span_extent(call.descales.q)},
          {"k_descale", span_extent(call.descales.k)},
          {"v_descale", span_extent(call.descales.v)}};
}

}  // namespace

AttentionCall scattered_call_for_checks(const AttentionCall& call, const ScatteredOutput& out) {
  STSA_CHECK(call.o.data == nullptr && call.lse.data == nullptr, InvalidArgument,
             "scattered output: call.o and call.lse must be empty (the output goes to the scattered tensors)");
  STSA_CHECK(out.o.data != nullptr, InvalidArgument, "scattered output: no output tensor");
  call.layout.validate();
  check_grid_and_orders(call, "scattered output", "output", out.grid, out.from, out.to, out.from);
  // The full output on its own: with one head in the call, the narrowed view
  // below has one head and its head stride would go unchecked.
  VideoLayout full = call.layout;
  full.heads = out.o.heads();
  validate_tensor("scattered o", out.o, full);  // validates `full` first (a head count >= 1, sizes that fit)
  if (out.lse.data != nullptr) validate_lse("scattered lse", out.lse, full);
  const std::int64_t count = call.layout.heads;
  check_head_map("scattered output", "output", out.heads, count, out.o.heads());
  const NamedExtent outputs[] = {NamedExtent::of("o", out.o), NamedExtent::of("lse", out.lse)};
  // The descales too: validate() sees only the narrowed o, and the heads beyond it are stored to.
  check_outputs_apart("scattered output: ", outputs, input_extents(call));
  AttentionCall checked = call;
  checked.o = out.o;
  checked.o.shape[2] = count;
  checked.lse = out.lse;
  if (checked.lse.data != nullptr) checked.lse.shape[1] = count;
  return checked;
}

void Backend::run_scattered(const AttentionCall& call, const ScatteredOutput& out) const {
  (void)call, (void)out;
  throw Unsupported(detail::concat("the ", name(), " backend does not store a scattered output"));
}

AttentionCall gathered_call_for_checks(const AttentionCall& call, const GatheredInput& in,
                                       const ScatteredOutput& out) {
  STSA_CHECK(call.q.data == nullptr && call.k.data == nullptr && call.v.data == nullptr, InvalidArgument,
             "gathered input: call.q, call.k and call.v must be empty (the inputs are read from the gathered tensors)");
  STSA_CHECK(in.q.data != nullptr && in.k.data != nullptr && in.v.data != nullptr, InvalidArgument,
             "gathered input: no input tensor");
  call.layout.validate();
  check_grid_and_orders(call, "gathered input", "input", in.grid, in.from, in.to, in.to);
  VideoLayout full = call.layout;
  full.heads = in.q.heads();
  validate_tensor("gathered q", in.q, full);
  validate_kv_tensors("gathered ", in.k, in.v, full);
  check_head_map("gathered input", "input", in.heads, call.layout.heads, full.heads);
  // The scattered output's checks against the whole inputs (overlaps included).
  AttentionCall whole = call;
  whole.q = in.q;
  whole.k = in.k;
  whole.v = in.v;
  AttentionCall checked = scattered_call_for_checks(whole, out);
  checked.q.shape[2] = call.layout.heads;
  // Grouped, the call's heads read K/V heads through the map: one head stands for them.
  const std::int64_t kv_heads = in.k.heads() == in.q.heads() ? call.layout.heads : 1;
  for (TensorView* t : {&checked.k, &checked.v}) t->shape[2] = kv_heads;
  return checked;
}

void Backend::run_gathered(const AttentionCall& call, const GatheredInput& in, const ScatteredOutput& out) const {
  (void)call, (void)in, (void)out;
  throw Unsupported(detail::concat("the ", name(), " backend does not read a gathered input"));
}

void validate_tensor(const char* name, const TensorView& t, const VideoLayout& layout) {
  layout.validate();
  STSA_CHECK(t.data != nullptr, InvalidArgument, name, " is null");
  const std::array<std::int64_t, 4> expected{layout.batch, layout.tokens(), layout.heads, layout.head_dim};
  STSA_CHECK(t.shape == expected, InvalidArgument, name, " has shape [", t.shape[0], ", ", t.shape[1], ", ",
             t.shape[2], ", ", t.shape[3], "] but the layout needs [B, N, H, D] = [", expected[0], ", ", expected[1],
             ", ", expected[2], ", ", expected[3], "]");
  validate_view_memory(name, t);
}

void check_kv_head_counts(std::string_view prefix, std::int64_t k_heads, std::int64_t v_heads, std::int64_t heads) {
  STSA_CHECK(v_heads == k_heads, InvalidArgument, prefix, "k and v must hold as many heads, got ", k_heads, " and ",
             v_heads);
  STSA_CHECK(k_heads >= 1 && k_heads <= heads && heads % k_heads == 0, InvalidArgument, prefix, "k and v hold ",
             k_heads, " heads: grouped-query attention needs a count that divides q's ", heads);
}

void validate_kv_tensors(const char* prefix, const TensorView& k, const TensorView& v, const VideoLayout& layout) {
  layout.validate();
  STSA_CHECK(k.data != nullptr, InvalidArgument, prefix, "k is null");
  STSA_CHECK(v.data != nullptr, InvalidArgument, prefix, "v is null");
  check_kv_head_counts(prefix, k.heads(), v.heads(), layout.heads);
  VideoLayout kv_layout = layout;
  kv_layout.heads = k.heads();
  validate_tensor(detail::concat(prefix, "k").c_str(), k, kv_layout);
  validate_tensor(detail::concat(prefix, "v").c_str(), v, kv_layout);
}

void validate_view_memory(const char* name, const TensorView& t) {
  STSA_CHECK(is_dtype(t.dtype), InvalidArgument, name, " has dtype ", int(t.dtype),
             ", not a DType value (fp32, bf16, fp16 or fp8)");
  named_extent(name, t);  // throws when the strides reach past the address space
  check_distinct_addresses(name, t.shape, t.stride);
  const auto address = reinterpret_cast<std::uintptr_t>(t.data);
  STSA_CHECK(address % element_size(t.dtype) == 0, InvalidArgument, name, " is not aligned to its element size");
}

void validate_lse(const char* name, const LseView& lse, const VideoLayout& layout) {
  layout.validate();
  const std::array<std::int64_t, 3> expected{layout.batch, layout.heads, layout.tokens()};
  STSA_CHECK(lse.shape == expected, InvalidArgument, name, " has shape [", lse.shape[0], ", ", lse.shape[1], ", ",
             lse.shape[2], "] but the layout needs [B, H, N] = [", expected[0], ", ", expected[1], ", ", expected[2],
             "]");
  STSA_CHECK(lse.data != nullptr, InvalidArgument, name, " is null");
  validate_lse_memory(name, lse);
}

void validate_lse_memory(const char* name, const LseView& lse) {
  named_extent(name, lse);  // throws when the strides reach past the address space
  check_distinct_addresses(name, lse.shape, lse.stride);
  STSA_CHECK(reinterpret_cast<std::uintptr_t>(lse.data) % alignof(float) == 0, InvalidArgument, name,
             " is not aligned to 4 bytes");
}

NamedExtent NamedExtent::of(std::string_view name, const TensorView& t) {
  return {name, t.byte_extent(), element_size(t.dtype), t.shape, t.stride};
}

NamedExtent NamedExtent::of(std::string_view name, const LseView& lse) {
  return {name, lse.byte_extent(), sizeof(float), {lse.shape[0], lse.shape[1], lse.shape[2], 1},
          {lse.stride[0], lse.stride[1], lse.stride[2], 0}};
}

void check_outputs_apart(std::string_view what, std::span<const NamedExtent> outputs,
                         std::span<const NamedExtent> inputs) {
  const auto overlap = [](const NamedExtent& a, const NamedExtent& b) {
    return extents_overlap(a.bytes, b.bytes) && !disjoint_slices_of_one_view(a, b);
  };
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (const NamedExtent& input : inputs)
      STSA_CHECK(!overlap(outputs[i], input), InvalidArgument, what, outputs[i].name, " overlaps an input tensor (",
                 input.name, ")");
    for (std::size_t j = 0; j < i; ++j)
      STSA_CHECK(!overlap(outputs[i], outputs[j]), InvalidArgument, what, outputs[i].name, " overlaps ",
                 outputs[j].name);
  }
}

namespace {

double factor(std::span<const float> values, std::int64_t b, std::int64_t h, std::int64_t heads) {
  return values.empty() ? 1.0 : double(values[std::size_t(b * heads + h)]);
}

}  // namespace

double Descales::score(std::int64_t b, std::int64_t h, std::int64_t heads) const {
  return factor(q, b, h, heads) * factor(k, b, h, heads);
}

double Descales::out(std::int64_t b, std::int64_t h, std::int64_t heads) const { return factor(v, b, h, heads); }

Descales Descales::for_heads(std::span<const std::int64_t> map, std::int64_t batch, std::int64_t heads,
                             std::vector<float>& storage) const {
  // Sizes only (B x H each), which the reads below rely on; the values are validate()'s, once per call.
  for (const std::span<const float> values : {q, k, v})
    STSA_CHECK(values.empty() || std::int64_t(values.size()) == batch * heads, InvalidArgument, "descales: ",
               values.size(), " factors for a call of ", batch, " x ", heads, " (batch x heads)");
  for (const std::int64_t h : map)
    STSA_CHECK(h >= 0 && h < heads, InvalidArgument, "descales: head ", h, " of a call of ", heads, " heads");
  const std::size_t count = std::size_t(batch) * map.size();
  // Filled apart, then moved into `storage`: this call's own spans may be views of it (narrowed twice).
  std::vector<float> filled(3 * count, 0.f);
  const std::span<const float> from[] = {q, k, v};
  bool given[3] = {};
  for (std::size_t which = 0; which < 3; ++which) {
    if (from[which].empty()) continue;
    given[which] = true;
    float* out = filled.data() + which * count;
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::size_t j = 0; j < map.size(); ++j)
        out[std::size_t(b) * map.size() + j] = from[which][std::size_t(b * heads + map[j])];
  }
  storage = std::move(filled);
  Descales picked;
  std::span<const float>* to[] = {&picked.q, &picked.k, &picked.v};
  for (std::size_t which = 0; which < 3; ++which)
    if (given[which]) *to[which] = std::span<const float>(storage.data() + which * count, count);
  return picked;
}

void validate_descales(const Descales& descales, std::int64_t batch, std::int64_t heads) {
  const std::pair<const char*, std::span<const float>> all[] = {
      {"q_descale", descales.q}, {"k_descale", descales.k}, {"v_descale", descales.v}};
  for (const auto& [name, values] : all) {
    if (values.empty()) continue;
    STSA_CHECK(std::int64_t(values.size()) == batch * heads, InvalidArgument, name, " must hold batch x heads (",
               batch, " x ", heads, ") values, got ", values.size());
    for (std::size_t i = 0; i < values.size(); ++i)
      STSA_CHECK(std::isfinite(values[i]) && values[i] > 0.f, InvalidArgument, name, " must be finite and > 0, got ",
                 values[i], " for (batch, head) (", std::int64_t(i) / heads, ", ", std::int64_t(i) % heads, ")");
  }
}

std::pair<const std::byte*, const std::byte*> span_extent(std::span<const float> values) {
  const auto* first = reinterpret_cast<const std::byte*>(values.data());
  return values.empty() ? std::pair<const std::byte*, const std::byte*>{nullptr, nullptr}
                        : std::pair{first, first + values.size_bytes()};
}

float AttentionCall::scale() const {
  return softmax_scale != 0.f ? softmax_scale : float(1.0 / std::sqrt(double(layout.head_dim)));
}

double AttentionCall::score_scale(std::int64_t b, std::int64_t h) const {
  return double(scale()) * descales.score(b, h, layout.heads);
}

namespace {

// Kernels compute exp2(score_scale x log2(e) x q.k) with that factor in fp32: a finite scale and
// descales whose product is past fp32's range would make it inf and every output NaN.
void check_score_scale(const AttentionCall& call) {
  const std::int64_t heads = call.layout.heads;
  const bool per_head = !call.descales.q.empty() || !call.descales.k.empty();
  double largest = 0;
  std::int64_t at = 0;
  for (std::int64_t i = 0; i < (per_head ? call.layout.batch * heads : 1); ++i) {
    const double factor = std::abs(call.score_scale(i / heads, i % heads));
    if (factor > largest) largest = factor, at = i;
  }
  constexpr double kLog2e = 1.44269504088896340736;
  STSA_CHECK(largest * kLog2e <= double(std::numeric_limits<float>::max()), InvalidArgument,
             "scale x q_descale x k_descale = ", largest, " for (batch, head) (", at / heads, ", ", at % heads,
             ") is too large: times log2(e) it is past fp32's range");
}

}  // namespace

void validate(const AttentionCall& call, bool require_plans) {
  call.layout.validate();
  validate_tensor("q", call.q, call.layout);
  validate_kv_tensors("", call.k, call.v, call.layout);
  validate_tensor("o", call.o, call.layout);
  STSA_CHECK(is_output_dtype(call.o.dtype), InvalidArgument, "o must be fp32, bf16 or fp16, got ",
             to_string(call.o.dtype), " (fp8 is an input type)");
  STSA_CHECK(call.q.dtype == call.k.dtype && call.k.dtype == call.v.dtype, InvalidArgument,
             "q, k and v must share a dtype, got ", to_string(call.q.dtype), ", ", to_string(call.k.dtype), ", ",
             to_string(call.v.dtype));
  STSA_CHECK(std::isfinite(call.softmax_scale), InvalidArgument, "softmax scale must be finite, got ",
             call.softmax_scale);
  validate_descales(call.descales, call.layout.batch, call.layout.heads);
  check_score_scale(call);
  if (call.lse.data != nullptr) validate_lse("lse", call.lse, call.layout);
  const NamedExtent outputs[] = {NamedExtent::of("o", call.o), NamedExtent::of("lse", call.lse)};
  check_outputs_apart("", outputs, input_extents(call));
  STSA_CHECK(std::int64_t(call.heads.size()) == call.layout.heads, InvalidArgument, "expected one mask per head (",
             call.layout.heads, "), got ", call.heads.size());
  for (std::size_t h = 0; h < call.heads.size(); ++h) {
    const HeadMask& head = call.heads[h];
    if (!head.compute) continue;
    STSA_CHECK(is_token_order(head.order), InvalidArgument, "head ", h, "'s token order ", int(head.order),
               " is not a TokenOrder value (frame-major or spatial-major)");
    head.spec.validate(call.layout.grid);
    if (!require_plans) continue;
    STSA_CHECK(head.plan != nullptr, InvalidArgument, "head ", h, " has no tile plan");
    head.plan->check_matches(call.layout.grid, head.spec, head.order);
  }
}

std::vector<HeadMask> uniform_heads(const VideoLayout& layout, const MaskSpec& spec, PlanCache& cache, TileShape tile,
                                    Alignment alignment) {
  layout.validate();
  auto plan = cache.get(layout.grid, spec, tile, alignment);
  return std::vector<HeadMask>(std::size_t(layout.heads), HeadMask{spec, spec.natural_order(), plan, true});
}

}  // namespace stsa
