// Fuzzes the attention call through the CPU backend: run(), run_scattered()
// (half of those reading a gathered input, run_gathered()), routed
// attention (routed_attention() with a Router, run_routed() with given
// decisions), and sequence-parallel attention (ulysses_attention() on the
// one-rank local communicator, with masks or a router, the text tokens as views
// of their own into the same tensors). Small random layouts, dtypes, memory layouts, padded and
// strided tensors, K and V with fewer heads than Q (grouped-query attention), masks, tile plans
// (exact and rounded), skipped heads, scales,
// router options, instruction sets and thread counts, with at most one planted
// defect per input (a wrong shape, a negative or overlapping stride, a stride
// whose offsets overflow, a misaligned or null pointer, an output over an input,
// a plan for another grid or mask or token order, a non-finite scale, a bad head
// map, router options out of range, a decision too many, a dtype, token order or text placement
// outside its enum, a mask kind or band order outside its enum, gather_heads/scatter_heads pairs of
// another batch size or a scatter's LSE views over the tensors). Sometimes bf16 (or fp32) Q and K are
// scaled by 2^-46..2^-58 and the softmax scale by its inverse square: a valid call whose products fp32
// must not flush (scale x descales past 2^91). Sometimes, instead, channel 0 of bf16 (or fp32) Q is
// +-2^64 or 0 and of K 2^63 x [1.5, 1.8] under a softmax scale of magnitude 0.7-1 and no descales:
// scores of ~3e38 that stay finite times the scale but not times log2 e. Whatever the input:
//   - the call is refused with stsa::Error, or every computed head's O and LSE
//     agree with the fp64 reference (reference_rows: the mask from its
//     definition, or what a rounded plan claims to compute; a routed head's
//     mask is the one the input gave it, or its router's decision);
//   - a call carrying a planted defect is refused with InvalidArgument (a
//     sequence-parallel one with DistError, which names the rank and why),
//     and one made only of valid choices runs;
//   - Q, K and V are unchanged, and no byte of the output buffers outside the
//     computed heads' elements is written (none at all when the call is refused).
// Buffers are sized to what their views can reach, so an access past a view
// lands in AddressSanitizer's redzone. Any other exception is a finding too.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fuzz_reader.hpp"
#include "stsa/attention.hpp"
#include "stsa/cpu.hpp"
#include "stsa/dist.hpp"
#include "stsa/error.hpp"
#include "stsa/permute.hpp"
#include "stsa/reference.hpp"
#include "stsa/routed.hpp"
#include "stsa/router.hpp"
#include "support/float_limit.hpp"

namespace {

using stsa::fuzz::Reader;

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "attention_fuzz: %s\n", what);
  std::abort();
}

void require(bool ok, const char* what) {
  if (!ok) finding(what);
}

// One tensor (or LSE) and the bytes behind it, with a copy to compare against.
struct Buffer {
  std::vector<std::byte> bytes;
  std::vector<std::byte> before;
  void remember() { before = bytes; }
  bool unchanged() const { return bytes == before; }
};

// Bytes for a view (random in the padding, which is never read) sized to what
// its strides reach, and the address of its first element: a negative stride
// walks down from the far end, as NumPy's reversed views do.
template <std::size_t Rank>
void* allocate(Buffer& buffer, std::mt19937_64& rng, const std::array<std::int64_t, Rank>& shape,
               const std::array<std::int64_t, Rank>& stride, std::size_t element_size, bool one_byte_more) {
  std::int64_t last = 0, first = 0;
  for (std::size_t i = 0; i < Rank; ++i) {
    last += std::max<std::int64_t>(shape[i] - 1, 0) * std::abs(stride[i]);
    if (stride[i] < 0) first += std::max<std::int64_t>(shape[i] - 1, 0) * -stride[i];
  }
  buffer.bytes.resize(std::size_t(last + 1) * element_size + (one_byte_more ? 1 : 0));
  for (auto& byte : buffer.bytes) byte = std::byte(rng());
  return buffer.bytes.data() + first * std::int64_t(element_size);
}

// A [B, N, H, D] view in either memory order, with padding after each row of
// channels and after each token (or head) block, as a slice of a larger tensor
// has, and now and then every other channel.
stsa::TensorView padded_view(Reader& in, const stsa::VideoLayout& layout, stsa::DType dtype) {
  const std::int64_t n = std::max<std::int64_t>(layout.tokens(), 1), h = std::max<std::int64_t>(layout.heads, 1),
                     d = std::max<std::int64_t>(layout.head_dim, 1);
  const std::int64_t channel = in.one_in(6) ? 2 : 1;
  const std::int64_t row = d * channel + in.next(0, 3);
  const std::int64_t block_pad = in.next(0, 3);
  stsa::TensorView v;
  v.dtype = dtype;
  v.shape = {layout.batch, layout.tokens(), layout.heads, layout.head_dim};
  if (in.next(0, 1) == 0) {  // [B, N, H, D]
    v.stride = {0, h * row + block_pad, row, channel};
    v.stride[0] = n * v.stride[1];
  } else {  // [B, H, N, D]
    v.stride = {0, row, n * row + block_pad, channel};
    v.stride[0] = h * v.stride[2];
  }
  return v;
}

enum class Defect { None, Shape, NegativeStride, ZeroStride, Misaligned, Null, HugeStride };

// A stride whose byte extent overflows 64 bits once its dimension has two elements,
// whatever the element size (set after the bytes exist). A smaller huge stride (2^61
// of 2-byte elements) can span less than the address space: a view the library cannot
// tell from a valid one, which points at memory that is not there.
constexpr std::int64_t kHugeStride = std::numeric_limits<std::int64_t>::max();

// Picks a defect for a view (when `allowed`) and applies the ones that change its
// shape or strides; the pointer defects and a huge stride (in dimension
// `huge_dim`) are applied once the bytes exist. `free_dim`: a dimension whose size
// the view chooses itself (a scattered output's heads), where a size change is no
// defect; `kept_dim`: one whose stride the caller needs as it is (a sequence-parallel
// call's tokens, split into video and text views by it).
template <std::size_t Rank>
Defect pick_defect(Reader& in, std::array<std::int64_t, Rank>& shape, std::array<std::int64_t, Rank>& stride,
                   std::size_t element_size, bool allowed, std::size_t& huge_dim, std::int64_t free_dim = -1,
                   std::int64_t kept_dim = -1) {
  if (!allowed) return Defect::None;
  const auto defect = Defect(in.next(1, 6));
  const std::size_t dim = std::size_t(in.next(0, Rank - 1));
  switch (defect) {
    case Defect::HugeStride:  // only a defect where the dimension has two elements
      if (shape[dim] < 2 || std::int64_t(dim) == kept_dim) return Defect::None;
      huge_dim = dim;
      return defect;
    case Defect::Misaligned:  // one byte off: no defect for one-byte (fp8) elements
      return element_size > 1 ? defect : Defect::None;
    case Defect::Shape:
      if (std::int64_t(dim) == free_dim) return Defect::None;
      shape[dim] += in.next(0, 1) ? 1 : -1;
      return defect;
    case Defect::NegativeStride:
      if (stride[dim] == 0) return Defect::None;
      stride[dim] = -stride[dim];
      return defect;
    case Defect::ZeroStride:
      // Elements that share an address: only a defect where the dimension has two of them.
      if (shape[dim] < 2) return Defect::None;
      stride[dim] = 0;
      return defect;
    default:
      return defect;
  }
}

void apply_pointer_defect(Defect defect, void*& data) {
  if (defect == Defect::Misaligned) data = static_cast<std::byte*>(data) + 1;
  if (defect == Defect::Null) data = nullptr;
}

struct Tensor {
  Buffer buffer;
  stsa::TensorView view;
  Defect defect = Defect::None;
  std::size_t element_bytes = 0;  // the dtype's it was made with (a planted dtype outside the enum has none)
};

Tensor make_tensor(Reader& in, std::mt19937_64& rng, const stsa::VideoLayout& layout, stsa::DType dtype,
                   bool allow_defect, bool fill, std::int64_t free_dim = -1, std::int64_t kept_dim = -1,
                   float fill_scale = 1.f) {
  Tensor t;
  t.element_bytes = stsa::element_size(dtype);
  t.view = padded_view(in, layout, dtype);
  std::size_t huge_dim = 0;
  t.defect = pick_defect(in, t.view.shape, t.view.stride, stsa::element_size(dtype), allow_defect, huge_dim, free_dim,
                         kept_dim);
  void* data = allocate(t.buffer, rng, t.view.shape, t.view.stride, stsa::element_size(dtype),
                        t.defect == Defect::Misaligned);
  if (fill && t.view.shape[0] > 0 && t.view.shape[1] > 0 && t.view.shape[2] > 0 && t.view.shape[3] > 0) {
    stsa::TensorView filled = t.view;
    filled.data = data;
    std::uniform_real_distribution<float> value(-1.f, 1.f);
    for (std::int64_t b = 0; b < filled.shape[0]; ++b)
      for (std::int64_t n = 0; n < filled.shape[1]; ++n)
        for (std::int64_t h = 0; h < filled.shape[2]; ++h)
          for (std::int64_t d = 0; d < filled.shape[3]; ++d) filled.store(b, n, h, d, value(rng) * fill_scale);
  }
  apply_pointer_defect(t.defect, data);
  if (t.defect == Defect::HugeStride) t.view.stride[huge_dim] = kHugeStride;
  t.view.data = data;
  t.buffer.remember();
  return t;
}

// Scores at the float limit (support/float_limit.hpp: Q K^T reaches ~3e38). Not into a tensor with a
// planted defect, nor a K of another dtype (fp16 cannot hold 2^63): false then.
bool plant_float_limit(std::mt19937_64& rng, Tensor& q, Tensor& k) {
  if (q.defect != Defect::None || k.defect != Defect::None || k.view.dtype != q.view.dtype) return false;
  stsa::testing::store_float_limit_channels(q.view, k.view, rng);
  q.buffer.remember();
  k.buffer.remember();
  return true;
}

struct Lse {
  Buffer buffer;
  stsa::LseView view;
  Defect defect = Defect::None;
};

Lse make_lse(Reader& in, std::mt19937_64& rng, const stsa::VideoLayout& layout, bool allow_defect,
             std::int64_t kept_dim = -1) {
  Lse l;
  const std::int64_t n = std::max<std::int64_t>(layout.tokens(), 1), h = std::max<std::int64_t>(layout.heads, 1);
  const std::int64_t row = n + in.next(0, 2);
  l.view.shape = {layout.batch, layout.heads, layout.tokens()};
  l.view.stride = {h * row, row, 1};
  std::size_t huge_dim = 0;
  l.defect = pick_defect(in, l.view.shape, l.view.stride, sizeof(float), allow_defect, huge_dim, -1, kept_dim);
  void* data = allocate(l.buffer, rng, l.view.shape, l.view.stride, sizeof(float), l.defect == Defect::Misaligned);
  // A null LSE means "not wanted", so the null defect is not one here.
  if (l.defect == Defect::Null) l.defect = Defect::None;
  apply_pointer_defect(l.defect, data);
  if (l.defect == Defect::HugeStride) l.view.stride[huge_dim] = kHugeStride;
  l.view.data = static_cast<float*>(data);
  l.buffer.remember();
  return l;
}

// Q, K and V's type: any, fp8 included.
stsa::DType pick_input_dtype(Reader& in) {
  constexpr stsa::DType kinds[] = {stsa::DType::F32, stsa::DType::BF16, stsa::DType::F16, stsa::DType::F8E4M3};
  return kinds[in.next(0, 3)];
}

// O's type: any but fp8 (an fp8 O is a planted defect).
stsa::DType pick_output_dtype(Reader& in) {
  constexpr stsa::DType kinds[] = {stsa::DType::F32, stsa::DType::BF16, stsa::DType::F16};
  return kinds[in.next(0, 2)];
}

stsa::MaskSpec pick_spec(Reader& in, const stsa::VideoGrid& grid) {
  const std::int64_t kind = in.next(0, 3);
  const bool anchor = in.next(0, 3) != 0;
  // Mostly in range; now and then one below it (refused by MaskSpec::validate).
  const std::int64_t parameter = in.next(-2, std::max<std::int64_t>(grid.tokens(), 1));
  switch (kind) {
    case 0:
      return stsa::MaskSpec::dense();
    case 1:
      return stsa::MaskSpec::spatial(parameter, anchor);
    case 2:
      return stsa::MaskSpec::temporal(parameter, anchor);
    default:
      return stsa::MaskSpec::frame_window(parameter / 8, anchor);
  }
}

std::shared_ptr<const stsa::TilePlan> try_build(const stsa::VideoGrid& grid, const stsa::MaskSpec& spec,
                                                stsa::TileShape tile, stsa::Alignment alignment) {
  try {
    return stsa::TilePlan::build(grid, spec, tile, alignment);
  } catch (const stsa::InvalidArgument&) {
    return nullptr;
  }
}

// The heads' masks, and whether one of them carries a defect the call must refuse.
struct Heads {
  std::vector<stsa::HeadMask> masks;
  bool defect = false;
};

// `extra_head`: one mask more than the layout's heads; `bad_plan`: one computed
// head's plan or token order does not fit it.
Heads make_heads(Reader& in, const stsa::VideoLayout& layout, bool extra_head, bool bad_plan) {
  Heads heads;
  const std::int64_t count = std::max<std::int64_t>(layout.heads, 0) + (extra_head ? 1 : 0);
  heads.defect = extra_head;
  const std::int64_t spoiled = bad_plan ? in.next(0, std::max<std::int64_t>(count - 1, 0)) : -1;
  const stsa::TileShape tiles[] = {{128, 128}, {64, 64}, {16, 64}, {37, 128}, {128, 192}, {1, 64}};
  for (std::int64_t h = 0; h < count; ++h) {
    stsa::HeadMask head;
    head.spec = pick_spec(in, layout.grid);
    head.order = head.spec.natural_order();
    head.compute = h == spoiled || !in.one_in(6);
    const auto alignment = in.one_in(4) ? stsa::Alignment::Round : stsa::Alignment::Exact;
    head.plan = try_build(layout.grid, head.spec, tiles[in.next(0, 5)], alignment);
    if (h == spoiled) {
      heads.defect = true;
      switch (in.next(0, 3)) {
        case 0:
          head.plan = nullptr;
          break;
        case 1: {  // a plan for a grid with one frame more
          stsa::VideoGrid other = layout.grid;
          other.frames += 1;
          head.plan = try_build(other, head.spec, {64, 64}, stsa::Alignment::Exact);
          break;
        }
        case 2: {  // a plan for another mask
          stsa::MaskSpec other = head.spec;
          other.anchor = !other.anchor;
          head.plan = try_build(layout.grid, other, {64, 64}, stsa::Alignment::Exact);
          break;
        }
        default:  // tensors in the other token order
          head.order = head.order == stsa::TokenOrder::FrameMajor ? stsa::TokenOrder::SpatialMajor
                                                                  : stsa::TokenOrder::FrameMajor;
      }
    }
    heads.masks.push_back(head);
  }
  return heads;
}

const stsa::Backend& cpu_backend(stsa::Isa isa, int threads) {
  // Kept across inputs, as a server keeps its backend: state one call leaves
  // behind (panels, scratch) must not leak into the next.
  static std::map<std::pair<int, int>, std::unique_ptr<stsa::Backend>> cache;
  auto& slot = cache[{int(isa), threads}];
  if (!slot) slot = stsa::make_cpu_backend({isa, threads});
  return *slot;
}

float out_rounding(stsa::DType dtype) {
  return dtype == stsa::DType::F32 ? 0.f : float(stsa::unit_roundoff(dtype));
}

// Marks the bytes of element (b, n, h, d) of `view` inside `buffer` as written.
void mark(const stsa::TensorView& view, const Buffer& buffer, std::vector<bool>& written, std::int64_t b,
          std::int64_t n, std::int64_t h, std::int64_t d) {
  const std::size_t size = stsa::element_size(view.dtype);
  const auto* at = static_cast<const std::byte*>(view.data) + view.offset(b, n, h, d) * std::int64_t(size);
  const std::size_t first = std::size_t(at - buffer.bytes.data());
  for (std::size_t i = 0; i < size; ++i) written[first + i] = true;
}

bool only_marked_changed(const Buffer& buffer, const std::vector<bool>& written) {
  for (std::size_t i = 0; i < buffer.bytes.size(); ++i)
    if (!written[i] && buffer.bytes[i] != buffer.before[i]) return false;
  return true;
}

// Inputs from which a run that never ran a mode, or compared nothing, is a finding. The rarest mode
// (scattered) runs on 1 input in 15-25 (measured), so 500 inputs miss it by chance with odds of ~1e-9;
// CI's 45 s runs 1,500-4,000. A replay of a few inputs (the seed corpus, a crash) stays below it.
constexpr long kInputsForEveryMode = 500;

// What the inputs came to, printed at exit (libFuzzer ends with exit(), which
// runs this destructor); a long run that compared nothing, or never ran a mode, fails here.
struct Tally {
  long inputs = 0, ran[4] = {}, ran_gathered = 0, ran_non_finite = 0, ran_descales = 0, ran_grouped = 0,
       refused_invalid = 0, refused_unsupported = 0;
  long defects_refused = 0, compared_elements = 0;
  // Refused as they must be: dtypes, token orders and text placements outside their enums in a call;
  // mask kinds and band orders outside theirs; gather/scatter pairs of another batch size or LSE views
  // over the tensors. Ran: calls with Q and K scaled down, and of them with a score scale past 2^91.
  long refused_dtype = 0, refused_order = 0, refused_placement = 0, refused_mask_enum = 0, refused_batch_pair = 0,
       refused_lse_overlap = 0, ran_tiny_qk = 0, ran_past_2_91 = 0, ran_float_limit = 0;
  ~Tally() {
    std::fprintf(stderr,
                 "attention_fuzz: planted and refused: %ld dtypes, %ld token orders, %ld text placements, %ld mask "
                 "kinds or band orders outside their enums, %ld gather/scatter pairs of another batch size, %ld "
                 "scatter LSE views over the tensors; ran %ld calls with Q and K scaled by 2^-46..2^-58 (%ld of "
                 "them bf16 with a score scale past 2^91) and %ld with scores at the float limit\n",
                 refused_dtype, refused_order, refused_placement, refused_mask_enum, refused_batch_pair,
                 refused_lse_overlap, ran_tiny_qk, ran_past_2_91, ran_float_limit);
    std::fprintf(stderr,
                 "attention_fuzz: ran %ld direct, %ld scattered (%ld of them from a gathered input), %ld routed "
                 "and %ld sequence-parallel calls (%ld with a NaN or infinity in Q, K or V, %ld with descales, %ld "
                 "with fewer K/V heads than Q heads; %ld O elements checked against the reference); refused %ld as "
                 "invalid (%ld with a planted defect), %ld as unsupported; %ld inputs\n",
                 ran[0], ran[1], ran_gathered, ran[2], ran[3], ran_non_finite, ran_descales, ran_grouped,
                 compared_elements, refused_invalid, defects_refused, refused_unsupported, inputs);
    if (inputs < kInputsForEveryMode) return;
    if (compared_elements == 0 || std::find(std::begin(ran), std::end(ran), 0) != std::end(ran)) {
      std::fprintf(stderr, "attention_fuzz: %ld inputs, but a mode never ran or nothing was compared: the library "
                   "refuses calls it should run\n", inputs);
      std::_Exit(1);  // from exit()'s destructors: the status libFuzzer's exit(0) would have given
    }
  }
} tally;

// Every computed head of `reference` (its O replaced here) against reference_rows
// with `predicate`; the library's row n of head h is at (out_row(n), out_head(h))
// of `o` and `lse`. No other byte of their buffers may have changed.
void check_outputs(stsa::AttentionCall reference, const stsa::PairPredicate& predicate, const Tensor& o,
                   const Lse& lse, const std::function<std::int64_t(std::int64_t)>& out_row,
                   const std::function<std::int64_t(std::int64_t)>& out_head) {
  const stsa::VideoLayout& layout = reference.layout;
  std::vector<float> scratch(std::size_t(layout.batch * layout.tokens() * layout.heads * layout.head_dim));
  reference.o = stsa::TensorView::contiguous(scratch.data(), stsa::DType::F32, layout.batch, layout.tokens(),
                                             layout.heads, layout.head_dim, stsa::MemoryLayout::BNHD);
  reference.lse = {};
  std::vector<std::int64_t> rows(std::size_t(layout.tokens()));
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<double> expected_o, expected_lse;
  stsa::reference_rows(reference, rows, expected_o, expected_lse, predicate);

  std::vector<bool> o_written(o.buffer.bytes.size()), lse_written(lse.buffer.bytes.size());
  const float o_rounding = out_rounding(o.view.dtype);
  const std::int64_t n_tokens = layout.tokens(), d_count = layout.head_dim;
  for (std::int64_t b = 0; b < layout.batch; ++b)
    for (std::int64_t h = 0; h < layout.heads; ++h) {
      if (!reference.heads[std::size_t(h)].compute) continue;
      for (std::int64_t n = 0; n < n_tokens; ++n) {
        const std::int64_t row = out_row(n), head = out_head(h);
        for (std::int64_t d = 0; d < d_count; ++d) {
          const double want = expected_o[std::size_t(((b * n_tokens + n) * layout.heads + h) * d_count + d)];
          const double got = o.view.load(b, row, head, d);
          // A non-finite value in the inputs: NaN or infinite where the reference is (which of the two may
          // differ: fp32 can round a tiny weight to 0, and 0 x inf is NaN), finite and close elsewhere.
          require(std::isfinite(got) == std::isfinite(want), "O is finite where the reference is not, or the reverse");
          // fp32 scores below ~35 in magnitude (|q|, |k| <= 1 per channel), |v| <= 1, then the output's rounding;
          // for a 16-bit output P may be rounded to its precision too (the AMX and AVX-512 kernels do so for
          // bf16, as bf16 FlashAttention kernels do), which moves O by up to that share of sum_j p_j |v_j| <= 1.
          require(!std::isfinite(want) || std::abs(got - want) <= 1e-3 + o_rounding * (std::abs(want) + 1.0),
                  "O differs from the reference");
          mark(o.view, o.buffer, o_written, b, row, head, d);
        }
        tally.compared_elements += d_count;
        if (lse.view.data == nullptr) continue;
        const double want = expected_lse[std::size_t((b * layout.heads + h) * n_tokens + n)];
        const float* at = &lse.view.at(b, head, row);
        const double got = *at;
        if (std::isinf(want) && want < 0)
          require(got == want, "LSE of a row without keys differs from the reference");
        else if (!std::isfinite(want))
          require(!std::isfinite(got), "LSE is finite where the reference's is not");
        else
          require(std::abs(got - want) <= 5e-4 * (1 + std::abs(want)), "LSE differs from the reference");
        const std::size_t first = std::size_t(reinterpret_cast<const std::byte*>(at) - lse.buffer.bytes.data());
        for (std::size_t i = 0; i < sizeof(float); ++i) lse_written[first + i] = true;
      }
    }
  require(only_marked_changed(o.buffer, o_written), "O bytes outside the computed heads' elements were written");
  require(lse.view.data == nullptr || only_marked_changed(lse.buffer, lse_written),
          "LSE bytes outside the computed heads' rows were written");
}

// What a rounded plan computes instead of the mask, for a call whose tensors are
// in `tensor_order` (rounded plans index tokens in their own order).
bool pair_computed(const stsa::VideoGrid& grid, const stsa::MaskSpec& spec, const stsa::TilePlan* plan,
                   stsa::TokenOrder tensor_order, std::int64_t qp, std::int64_t kp) {
  if (plan == nullptr || plan->alignment() != stsa::Alignment::Round)
    return stsa::allowed_at(grid, spec, tensor_order, qp, kp);
  const auto in_plan = [&](std::int64_t p) { return grid.position(grid.coord(p, tensor_order), plan->order()); };
  return plan->computes(in_plan(qp), in_plan(kp));
}

enum class Mode { Direct, Scattered, Routed, Ulysses };

// The video and the text tokens of a whole view (tokens along dimension `dim`:
// 1 of a [B, N, H, D] tensor, 2 of a [B, H, N] LSE), as a one-rank Ulysses call
// takes them: views of their own into the same bytes, the text before or after
// the video. The view's own token count counts, planted defects included; the
// text part is empty without text, and a null view's parts are null.
template <class View>
std::pair<View, View> split_tokens(const View& whole, std::size_t dim, std::size_t element_bytes,
                                   const stsa::VideoGrid& grid) {
  const std::int64_t text = std::max<std::int64_t>(grid.text_tokens, 0);
  const std::int64_t video = std::max<std::int64_t>(whole.shape[dim] - text, 0);
  const bool before = grid.text_placement == stsa::TextPlacement::Before;
  const auto part = [&](std::int64_t first, std::int64_t count) {
    View v = whole;
    v.shape[dim] = count;
    if (v.data != nullptr)
      v.data = reinterpret_cast<decltype(v.data)>(reinterpret_cast<std::byte*>(v.data) +
                                                  first * whole.stride[dim] * std::int64_t(element_bytes));
    return v;
  };
  return {part(before ? text : 0, video), text > 0 ? part(before ? 0 : video, text) : View{}};
}

// Whether a whole view's defect survives its split into video and text views
// (`token_stride`, `tokens`: the view's along its token dimension): a zero token
// stride makes two elements share an address only inside a part of two tokens
// or more, or, for an output, across the two parts; two inputs may alias.
bool defect_survives_split(Defect defect, std::int64_t token_stride, std::int64_t tokens,
                           const stsa::VideoGrid& grid, bool output) {
  if (defect != Defect::ZeroStride || token_stride != 0) return defect != Defect::None;
  const std::int64_t text = std::max<std::int64_t>(grid.text_tokens, 0);
  const std::int64_t video = std::max<std::int64_t>(tokens - text, 0);
  return video >= 2 || text >= 2 || (output && video >= 1 && text >= 1);
}

// The rules of layout.validate() and MaskSpec::validate() (layout.cpp, mask.cpp), and whether this CPU
// runs `isa`: what a call made only of valid choices has.
bool layout_valid(const stsa::VideoLayout& layout) {
  return layout.grid.frames >= 1 && layout.grid.height >= 1 && layout.grid.width >= 1 &&
         layout.grid.text_tokens >= 0 && layout.batch >= 1 && layout.heads >= 1 && layout.head_dim >= 1 &&
         layout.head_dim <= 512;
}

bool spec_valid(const stsa::MaskSpec& spec) { return spec.band >= -1 && spec.frame_radius >= -1; }

bool isa_available(stsa::Isa isa) {
  try {
    stsa::resolve_isa(isa);
    return true;
  } catch (const stsa::Unsupported&) {
    return false;
  }
}

stsa::dist::Communicator& one_rank() {
  static const auto comm = stsa::dist::make_local_communicator();
  return *comm;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Reader in(data, size, /*random_tail=*/true);
  ++tally.inputs;
  std::mt19937_64 rng(std::uint64_t(in.next(0, 32767)) << 15 | std::uint64_t(in.next(0, 32767)));

  // Now and then a layout the checks must refuse; otherwise small valid ones.
  stsa::VideoLayout layout;
  layout.grid.frames = in.one_in(24) ? 0 : in.next(1, 4);
  layout.grid.height = in.next(1, 5);
  layout.grid.width = in.next(1, 5);
  layout.grid.text_tokens = in.one_in(24) ? -1 : in.next(0, 7);
  layout.grid.text_placement = in.next(0, 1) ? stsa::TextPlacement::Before : stsa::TextPlacement::After;
  layout.batch = in.one_in(24) ? 0 : in.next(1, 2);
  layout.heads = in.one_in(24) ? 0 : in.next(1, 3);
  // 72, 59 and 1 run padded to a kernel's head dim; 129 is a valid layout the CPU kernels do not take
  // (Unsupported); 0 an invalid one.
  constexpr std::int64_t head_dims[] = {64, 80, 96, 128, 64, 128, 72, 59, 1, 129, 0};
  layout.head_dim = head_dims[in.one_in(8) ? in.next(6, 10) : in.next(0, 5)];
  // Now and then grouped-query attention: K and V with one head for all, or 2 for 4.
  std::int64_t kv_heads = 0;  // 0: the layout's
  if (layout.heads >= 1 && in.one_in(4)) {
    if (in.next(0, 1)) layout.heads = 4;
    kv_heads = layout.heads == 4 && in.next(0, 1) ? 2 : 1;
  }
  const Mode mode = Mode(in.next(0, 3));

  // At most one planted defect per input, so that every refusal of one is its own.
  enum class Plant {
    None, Q, K, V, O, Lse, KDtype, ODtype, OverQ, LseOverO, Scale,
    ExtraHead, BadPlan, ScatterHeads,  // direct and scattered calls
    RouterOptions, Decisions,          // routed and sequence-parallel calls (Decisions: a mask too many)
    Descale,                           // a per-(batch, head) descale of 0, NaN or one value too many
    CallEnum,                          // a dtype, token order or text placement outside its enum
    MaskEnum,                          // a head's mask kind or band order outside its enum
    Permute,                           // scattered calls: gather_heads/scatter_heads given a bad pair
    Count
  };
  const Plant plant = in.one_in(3) ? Plant(in.next(1, int(Plant::Count) - 1)) : Plant::None;
  bool must_refuse = false;
  // CallEnum: 0 a dtype, 1 a token order (direct and scattered calls), 2 the text placement.
  std::int64_t call_enum = plant == Plant::CallEnum ? in.next(0, 2) : -1;
  if (call_enum == 1 && mode != Mode::Direct && mode != Mode::Scattered) call_enum = 0;
  if (call_enum == 2) {
    layout.grid.text_placement = stsa::TextPlacement(2 + in.next(0, 253));
    must_refuse = true;
  }

  const stsa::DType input_dtype = pick_input_dtype(in);
  // Q and K scaled down by 2^-tiny_exp, the softmax scale up by 2^(2 tiny_exp) (below).
  const int tiny_exp = (input_dtype == stsa::DType::BF16 || input_dtype == stsa::DType::F32) && in.one_in(6)
                           ? int(in.next(46, 58))
                           : 0;
  const float tiny = std::exp2(float(-tiny_exp));
  const bool float_limit = tiny_exp == 0 && (input_dtype == stsa::DType::BF16 || input_dtype == stsa::DType::F32) &&
                           in.one_in(8);
  stsa::DType k_dtype = input_dtype;
  if (plant == Plant::KDtype) {
    k_dtype = stsa::DType((int(input_dtype) + in.next(1, 3)) % 4);
    must_refuse = true;
  }
  // A sequence-parallel call splits the tokens into video and text views with their stride.
  const std::int64_t kept_dim = mode == Mode::Ulysses ? 1 : -1;
  stsa::VideoLayout kv_layout = layout;
  if (kv_heads > 0) kv_layout.heads = kv_heads;
  Tensor q = make_tensor(in, rng, layout, input_dtype, plant == Plant::Q, true, -1, kept_dim, tiny);
  Tensor k = make_tensor(in, rng, kv_layout, k_dtype, plant == Plant::K, true, -1, kept_dim, tiny);
  Tensor v = make_tensor(in, rng, kv_layout, input_dtype, plant == Plant::V, true, -1, kept_dim);
  const auto defective = [&](const Tensor& t, bool output) {
    if (mode != Mode::Ulysses) return t.defect != Defect::None;
    return defect_survives_split(t.defect, t.view.stride[1], t.view.shape[1], layout.grid, output);
  };
  must_refuse |= defective(q, false) || defective(k, false) || defective(v, false);
  const bool at_float_limit = float_limit && plant_float_limit(rng, q, k);
  bool non_finite = false;
  if (!must_refuse && in.one_in(6)) {
    // One NaN or infinity in Q, K or V: the rows that see it become non-finite
    // where the reference's do, and every other row stays exact (attention.hpp).
    Tensor& t = in.next(0, 2) == 0 ? q : in.next(0, 1) ? k : v;
    const auto& shape = t.view.shape;
    if (shape[0] > 0 && shape[1] > 0 && shape[2] > 0 && shape[3] > 0) {
      constexpr float kValues[] = {NAN, INFINITY, -INFINITY};
      t.view.store(in.next(0, shape[0] - 1), in.next(0, shape[1] - 1), in.next(0, shape[2] - 1),
                   in.next(0, shape[3] - 1), kValues[in.next(0, 2)]);
      t.buffer.remember();
      non_finite = true;
    }
  }

  // The output: the call's own [B, N, H, D] O, or a larger tensor its heads scatter into.
  stsa::VideoLayout out_layout = layout;
  std::vector<std::int64_t> out_heads;
  if (mode == Mode::Scattered) {
    out_layout.heads = std::max<std::int64_t>(layout.heads, 0) + in.next(0, 2);
    out_heads.resize(std::size_t(std::max<std::int64_t>(layout.heads, 0)));
    std::vector<std::int64_t> all(std::size_t(out_layout.heads));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::copy_n(all.begin(), out_heads.size(), out_heads.begin());
    if (plant == Plant::ScatterHeads && !out_heads.empty()) {  // a head listed twice, or one past the end
      const bool twice = out_heads.size() > 1 && in.next(0, 1) == 0;
      out_heads.back() = twice ? out_heads.front() : out_layout.heads;
      must_refuse = true;
    }
  }
  // A scattered output's head count is its own (at least the heads mapped into it).
  const stsa::DType out_dtype = plant == Plant::ODtype ? stsa::DType::F8E4M3 : pick_output_dtype(in);
  Tensor o = make_tensor(in, rng, out_layout, out_dtype, plant == Plant::O, false, mode == Mode::Scattered ? 2 : -1,
                         kept_dim);
  must_refuse |= defective(o, true) || plant == Plant::ODtype;
  if (plant == Plant::OverQ) {  // O written over Q's bytes
    o.view.data = q.view.data;
    must_refuse = true;
  }
  Lse lse;
  if (plant == Plant::Lse || plant == Plant::LseOverO || in.next(0, 1)) {
    lse = make_lse(in, rng, out_layout, plant == Plant::Lse, mode == Mode::Ulysses ? 2 : -1);
    must_refuse |= mode == Mode::Ulysses
                       ? defect_survives_split(lse.defect, lse.view.stride[2], lse.view.shape[2], layout.grid, true)
                       : lse.defect != Defect::None;
    if (plant == Plant::LseOverO) {  // LSE over O's bytes
      lse.view.data = static_cast<float*>(o.view.data);
      must_refuse = true;
    }
  }
  float softmax_scale = 0.f;  // the default, 1 / sqrt(D)
  if (plant == Plant::Scale) {
    softmax_scale = in.next(0, 1) ? NAN : -INFINITY;
    must_refuse = true;
  } else if (float_limit) {  // past ln 2, so that max x scale x log2 e passes FLT_MAX
    softmax_scale = float(in.next(70, 100) * (in.next(0, 1) ? 1 : -1)) / 100.f;
  } else if (tiny_exp != 0) {  // |scale| x 2^(2 tiny_exp) / sqrt(D), below 2^119: past fp32 only with descales
    softmax_scale = float(in.next(50, 300) * (in.next(0, 1) ? 1 : -1)) / 100.f /
                    std::sqrt(float(std::max<std::int64_t>(layout.head_dim, 1))) * std::exp2(float(2 * tiny_exp));
  } else if (in.next(0, 1)) {
    softmax_scale = float(in.next(-300, 300)) / 100.f / std::sqrt(float(std::max<std::int64_t>(layout.head_dim, 1)));
  }

  // Per-(batch, head) descales for some of q, k and v, sometimes (the reference applies them too).
  std::vector<float> descales[3];
  if (plant == Plant::Descale || (!float_limit && in.one_in(3))) {  // (descales of 4 would pass FLT_MAX there)
    const std::int64_t count = std::max<std::int64_t>(layout.batch, 0) * std::max<std::int64_t>(layout.heads, 0);
    for (auto& factors : descales) {
      if (in.next(0, 2) == 0) continue;
      for (std::int64_t i = 0; i < count; ++i) factors.push_back(std::exp2(float(in.next(-8, 8)) / 4.f));
    }
    if (plant == Plant::Descale) {
      auto& bad = descales[in.next(0, 2)];
      bad.resize(std::size_t(count), 1.f);
      if (count == 0 || in.next(0, 1))
        bad.push_back(1.f);
      else
        bad[std::size_t(in.next(0, int(std::min<std::int64_t>(count, 1000)) - 1))] = in.next(0, 1) ? 0.f : NAN;
      must_refuse = true;
    }
  }
  const stsa::Descales call_descales{descales[0], descales[1], descales[2]};
  if (call_enum == 0) {  // one of Q, K, V and O with a dtype outside the enum
    Tensor* tensors[] = {&q, &k, &v, &o};
    tensors[in.next(0, 3)]->view.dtype = stsa::DType(4 + in.next(0, 251));
    must_refuse = true;
  }

  constexpr stsa::Isa isas[] = {stsa::Isa::Auto, stsa::Isa::Scalar, stsa::Isa::Avx2, stsa::Isa::Avx512,
                                stsa::Isa::Amx};
  const stsa::Isa backend_isa = isas[in.next(0, 4)];
  const stsa::Backend& backend = cpu_backend(backend_isa, int(in.next(1, 3)));
  // The process defaults change between calls, as stsa.set_num_threads / stsa.set_isa change them:
  // the Auto backend and the router resolve them at every call (a new count remakes the pool).
  try {
    stsa::set_cpu_defaults({isas[in.next(0, 4)], int(in.next(0, 3))});
  } catch (const stsa::Unsupported&) {  // an instruction set this CPU lacks: the defaults stay
  }

  stsa::AttentionCall call;
  call.layout = layout;
  call.q = q.view;
  call.k = k.view;
  call.v = v.view;
  call.softmax_scale = softmax_scale;
  call.descales = call_descales;
  stsa::ScatteredOutput scatter;
  // A scattered call that reads a gathered input: its call without q, k, v, and where they come from.
  bool gathered = false;
  std::vector<std::int64_t> in_heads;
  stsa::GatheredInput gather;
  stsa::AttentionCall in_place;
  stsa::PlanCache plans;
  std::function<void()> run;
  // Filled by a routed call: what its heads ran with; `given`: the decisions run_routed was given.
  std::vector<stsa::HeadRoute> routes, given;
  bool router_isa_lacking = false;  // a routed call's router asked for an instruction set this CPU lacks
  stsa::RoutedOptions routed_options;
  // Filled by a sequence-parallel call.
  stsa::dist::UlyssesCall ulysses;
  std::optional<stsa::RouterOptions> ulysses_router;
  if (mode == Mode::Direct || mode == Mode::Scattered) {
    Heads heads = make_heads(in, layout, plant == Plant::ExtraHead, plant == Plant::BadPlan);
    must_refuse |= heads.defect;
    call.heads = heads.masks;
  }
  if (mode == Mode::Direct) {
    call.o = o.view;
    call.lse = lse.view;
    run = [&] { backend.run(call); };
  } else if (mode == Mode::Scattered) {
    scatter.grid = layout.grid;
    scatter.from = in.next(0, 1) ? stsa::TokenOrder::SpatialMajor : stsa::TokenOrder::FrameMajor;
    scatter.to = in.next(0, 1) ? stsa::TokenOrder::SpatialMajor : stsa::TokenOrder::FrameMajor;
    scatter.heads = out_heads;
    scatter.o = o.view;
    scatter.lse = lse.view;
    // Every computed head's tokens must be in the order the scatter reads.
    for (const auto& head : call.heads) must_refuse |= head.compute && head.order != scatter.from;
    run = [&] { backend.run_scattered(call, scatter); };
    if (in.next(0, 1)) {  // the same heads read in place from q, k, v with their heads and tokens shuffled
      gathered = true;
      in_heads.resize(std::size_t(std::max<std::int64_t>(layout.heads, 0)));
      std::iota(in_heads.begin(), in_heads.end(), 0);
      std::shuffle(in_heads.begin(), in_heads.end(), rng);
      if (plant == Plant::ScatterHeads && !in_heads.empty() && in.next(0, 1)) {  // an input head past the end
        in_heads.back() = layout.heads;
        must_refuse = true;
      }
      gather = {layout.grid, in.next(0, 1) ? stsa::TokenOrder::SpatialMajor : stsa::TokenOrder::FrameMajor,
                in.next(0, 1) ? stsa::TokenOrder::SpatialMajor : stsa::TokenOrder::FrameMajor, in_heads,
                q.view, k.view, v.view};
      for (const auto& head : call.heads) must_refuse |= head.compute && head.order != gather.to;
      in_place = call;
      in_place.q = in_place.k = in_place.v = stsa::TensorView{};
      run = [&] { backend.run_gathered(in_place, gather, scatter); };
    }
  } else if (mode == Mode::Ulysses) {
    // One rank holds every video token; the text tokens are views of their own.
    const auto split = [&](const Tensor& t) { return split_tokens(t.view, 1, t.element_bytes, layout.grid); };
    ulysses.layout = layout;
    std::tie(ulysses.q, ulysses.text_q) = split(q);
    std::tie(ulysses.k, ulysses.text_k) = split(k);
    std::tie(ulysses.v, ulysses.text_v) = split(v);
    std::tie(ulysses.o, ulysses.text_o) = split(o);
    std::tie(ulysses.lse, ulysses.text_lse) = split_tokens(lse.view, 2, sizeof(float), layout.grid);
    ulysses.softmax_scale = softmax_scale;
    ulysses.descales = call_descales;
    const stsa::TileShape tiles[] = {{128, 128}, {64, 64}, {37, 128}, {128, 192}};
    ulysses.tile = tiles[in.next(0, 3)];
    ulysses.alignment = in.one_in(4) ? stsa::Alignment::Round : stsa::Alignment::Exact;
    // Routed on the rank, or given masks: one per head (one more when planted), or one for all.
    if (in.next(0, 1)) {
      stsa::RouterOptions router;
      router.samples = int(in.next(1, 24));
      router.spatial_density = double(in.next(0, 20)) / 20;
      router.temporal_density = double(in.next(0, 20)) / 20;
      router.try_frame_window = in.next(0, 1) == 1;
      router.seed = std::uint64_t(in.next(0, 1000));
      router.threads = int(in.next(1, 2));
      if (plant == Plant::RouterOptions) {
        router.temporal_density = in.next(0, 1) ? 1.5 : -0.25;
        must_refuse = true;
      }
      ulysses_router = router;
    } else {
      const std::int64_t heads = std::max<std::int64_t>(layout.heads, 0);
      const std::int64_t count = plant == Plant::Decisions ? heads + 1 : in.one_in(3) ? 1 : heads;
      must_refuse |= plant == Plant::Decisions && count != 1;
      for (std::int64_t h = 0; h < count; ++h) ulysses.masks.push_back(pick_spec(in, layout.grid));
    }
    static stsa::dist::UlyssesWorkspace workspace;  // kept across inputs, as a rank keeps it across calls
    run = [&] {
      // Built here, as a caller builds it before the call: bad options are refused by its constructor.
      std::optional<stsa::Router> router;
      if (ulysses_router) {
        router.emplace(*ulysses_router);
        ulysses.router = &*router;
      }
      routes = stsa::dist::ulysses_attention(one_rank(), ulysses, backend, plans, workspace).routes;
      ulysses.router = nullptr;
    };
  } else {
    const stsa::RoutedCall routed{layout, q.view, k.view, v.view, o.view, lse.view, softmax_scale, call_descales};
    const stsa::TileShape tiles[] = {{128, 128}, {64, 64}, {37, 128}, {128, 192}};
    routed_options.tile = tiles[in.next(0, 3)];
    routed_options.alignment = in.one_in(4) ? stsa::Alignment::Round : stsa::Alignment::Exact;
    routed_options.permute_threads = int(in.next(0, 2));
    routed_options.fuse_scatter = in.next(0, 1) == 1;
    routed_options.fuse_gather = in.next(0, 1) == 1;  // the CPU backend reads Q, K, V in place where both are fused
    stsa::RouterOptions router;
    router.samples = int(in.next(1, 24));
    router.spatial_density = double(in.next(0, 20)) / 20;
    router.temporal_density = double(in.next(0, 20)) / 20;
    router.frame_window_density = double(in.next(0, 20)) / 20;
    router.try_frame_window = in.next(0, 1) == 1;
    router.max_rel_l2 = double(in.next(0, 10)) / 10;
    router.anchor = in.next(0, 3) != 0;
    router.seed = std::uint64_t(in.next(0, 1000));
    router.threads = int(in.next(1, 2));
    // The fp32 path, or (Auto: for 16-bit inputs on a CPU with AMX) tile products.
    router.isa = in.next(0, 1) ? stsa::Isa::Avx512 : stsa::Isa::Auto;
    if (in.next(0, 1)) {  // routed here
      router_isa_lacking = !isa_available(router.isa);
      if (plant == Plant::RouterOptions) {  // a density outside [0, 1], no sampled rows, or no such instruction set
        switch (in.next(0, 2)) {
          case 0:
            router.spatial_density = in.next(0, 1) ? 1.5 : -0.25;
            break;
          case 1:
            router.samples = 0;
            break;
          default:
            router.isa = static_cast<stsa::Isa>(9);
        }
        must_refuse = true;
      }
      run = [&, routed, router] {
        routes = stsa::routed_attention(backend, plans, routed, stsa::Router(router), routed_options).heads;
      };
    } else {  // given decisions, one per head (one more when planted)
      given.resize(std::size_t(std::max<std::int64_t>(layout.heads, 0)) + (plant == Plant::Decisions ? 1 : 0));
      must_refuse |= plant == Plant::Decisions;
      for (auto& decision : given) {
        decision.route = stsa::Route(in.next(0, 3));
        try {
          decision.spec = stsa::route_spec(layout.grid, decision.route, router);
        } catch (const stsa::InvalidArgument&) {
          must_refuse = true;  // no mask fits this grid: it is not a valid one, and the call must say so
        }
      }
      run = [&, routed] { routes = stsa::run_routed(backend, plans, routed, given, routed_options).heads; };
    }
  }

  // A mask kind or band order outside its enum in one of the masks the call is given.
  const auto spoil_mask = [&](stsa::MaskSpec& spec) {
    if (in.next(0, 1))
      spec.kind = stsa::MaskKind(3 + in.next(0, 252));
    else
      spec.band_order = stsa::TokenOrder(2 + in.next(0, 253));
    must_refuse = true;
  };
  if (plant == Plant::MaskEnum) {
    if (!call.heads.empty()) {
      auto& head = call.heads[std::size_t(in.next(0, std::int64_t(call.heads.size()) - 1))];
      head.compute = true;
      spoil_mask(head.spec);
    } else if (!given.empty()) {
      spoil_mask(given[std::size_t(in.next(0, std::int64_t(given.size()) - 1))].spec);
    } else if (!ulysses.masks.empty()) {
      spoil_mask(ulysses.masks[std::size_t(in.next(0, std::int64_t(ulysses.masks.size()) - 1))]);
    }
  }
  if (call_enum == 1) {  // a token order outside the enum: a head's, or the scatter's or the gather's
    const auto bad_order = stsa::TokenOrder(2 + in.next(0, 253));
    const std::int64_t where = in.next(0, mode == Mode::Scattered ? (gathered ? 4 : 2) : 0);
    if (where == 0 && !call.heads.empty()) {
      auto& head = call.heads[std::size_t(in.next(0, std::int64_t(call.heads.size()) - 1))];
      head.compute = true;
      head.order = bad_order;
    } else if (where == 1) {
      scatter.from = bad_order;
    } else if (where == 2) {
      scatter.to = bad_order;
    } else if (where == 3) {
      gather.from = bad_order;
    } else if (where == 4) {
      gather.to = bad_order;
    }
    must_refuse |= where != 0 || !call.heads.empty();
  }
  if (gathered) in_place.heads = call.heads;  // the gathered call's copy of them
  if (plant == Plant::Permute && mode == Mode::Scattered) {
    // Instead of the call: a gather whose pairs are not all of one batch size, or a scatter whose LSE
    // destination lies over its O, or whose O lies over the packed LSE. Refused with InvalidArgument,
    // nothing written.
    const std::int64_t b = std::max<std::int64_t>(layout.batch, 0), n = std::max<std::int64_t>(layout.tokens(), 0),
                       h = std::max<std::int64_t>(layout.heads, 0), d = std::max<std::int64_t>(layout.head_dim, 0);
    const auto order = [&] { return in.next(0, 1) ? stsa::TokenOrder::SpatialMajor : stsa::TokenOrder::FrameMajor; };
    const std::int64_t variant = in.next(0, 2);
    bool refused_it = false;
    try {
      if (variant == 0) {
        const std::int64_t odd = in.next(0, 2);
        const bool shrink_source = b >= 2 && in.next(0, 1);
        stsa::TensorView sources[] = {q.view, k.view, v.view};
        stsa::Tensor packed[3];
        stsa::TensorView packed_views[3];
        for (std::int64_t i = 0; i < 3; ++i) {
          packed[i] = stsa::Tensor(sources[i].dtype, b + (i == odd && !shrink_source ? 1 : 0), n, h, d);
          packed_views[i] = packed[i].view();
        }
        if (shrink_source) sources[odd].shape[0] -= 1;
        std::vector<std::int64_t> heads(static_cast<std::size_t>(h));
        std::iota(heads.begin(), heads.end(), 0);
        std::shuffle(heads.begin(), heads.end(), rng);
        stsa::gather_heads(layout.grid, order(), order(), heads, sources, packed_views, int(in.next(0, 2)));
      } else {
        stsa::Tensor packed(o.view.dtype, b, n, h, d);
        std::vector<float> packed_lse(std::size_t(std::max<std::int64_t>(b * h * n, 1)));
        std::vector<float> lse_out(std::size_t(std::max<std::int64_t>(b * out_layout.heads * n, 1)));
        const auto packed_lse_view = stsa::LseView::contiguous(packed_lse.data(), b, h, n);
        stsa::TensorView dest = o.view;
        auto lse_dest = stsa::LseView::contiguous(lse_out.data(), b, out_layout.heads, n);
        if (variant == 1)
          lse_dest.data = static_cast<float*>(o.view.data);  // the LSE destination over O
        else
          dest.data = packed_lse.data();  // O over the packed LSE
        const stsa::TensorView packed_views[] = {packed.view()};
        const stsa::TensorView dests[] = {dest};
        stsa::scatter_heads(layout.grid, order(), order(), out_heads, packed_views, dests, packed_lse_view, lse_dest,
                            int(in.next(0, 2)));
      }
    } catch (const stsa::InvalidArgument&) {
      refused_it = true;
    }
    require(refused_it, variant == 0 ? "gather_heads took pairs of different batch sizes"
                                     : "scatter_heads took an LSE view over its tensors");
    ++(variant == 0 ? tally.refused_batch_pair : tally.refused_lse_overlap);
    require(q.buffer.unchanged() && k.buffer.unchanged() && v.buffer.unchanged() && o.buffer.unchanged(),
            "a refused gather or scatter wrote a tensor");
    return 0;
  }

  // A call made only of valid choices (no planted defect, a valid layout of a head dim the CPU kernels take,
  // valid masks, instruction sets this CPU has) must run: a refusal of it is a finding (a sequence-parallel
  // call whose video and text views of one O interleave in memory was one).
  bool must_run = !must_refuse && layout_valid(layout) && layout.head_dim <= 128 && isa_available(backend_isa) &&
                  !router_isa_lacking;
  for (const auto& head : call.heads) must_run &= spec_valid(head.spec);
  for (const auto& spec : ulysses.masks) must_run &= spec_valid(spec);
  const auto refused = [&](const std::exception& error) {
    if (must_run) finding(("a call made only of valid choices was refused: " + std::string(error.what())).c_str());
  };
  const auto count_new_plant = [&] {
    tally.refused_dtype += call_enum == 0;
    tally.refused_order += call_enum == 1 && must_refuse;
    tally.refused_placement += call_enum == 2;
    tally.refused_mask_enum += plant == Plant::MaskEnum && must_refuse;
  };
  bool ran = false;
  try {
    run();
    ran = true;
  } catch (const stsa::InvalidArgument& error) {
    refused(error);
    ++tally.refused_invalid;
    tally.defects_refused += must_refuse;
    count_new_plant();
  } catch (const stsa::Unsupported& error) {
    require(!must_refuse, "a defective call was refused as unsupported, not as invalid");
    refused(error);
    ++tally.refused_unsupported;
  } catch (const stsa::DistError& error) {
    // Every refusal of a sequence-parallel call, Unsupported ones included: all ranks throw the same.
    require(mode == Mode::Ulysses, "a single-device call threw DistError");
    refused(error);
    ++tally.refused_invalid;
    tally.defects_refused += must_refuse;
    count_new_plant();
  }
  require(q.buffer.unchanged() && k.buffer.unchanged() && v.buffer.unchanged(), "an input was written");
  if (!ran) {
    require(o.buffer.unchanged() && lse.buffer.unchanged(), "a refused call wrote its output");
    return 0;
  }
  require(!must_refuse, "a defective call ran");
  ++tally.ran[int(mode)];
  tally.ran_gathered += gathered;
  tally.ran_non_finite += non_finite;
  tally.ran_descales += !call_descales.empty();
  tally.ran_grouped += kv_heads > 0 && kv_heads < layout.heads;
  tally.ran_float_limit += at_float_limit;
  if (tiny_exp != 0) {
    ++tally.ran_tiny_qk;
    const auto largest = [](const std::vector<float>& f) {
      return f.empty() ? 1.0 : double(*std::max_element(f.begin(), f.end()));
    };
    tally.ran_past_2_91 += input_dtype == stsa::DType::BF16 &&
                           std::abs(double(softmax_scale)) * largest(descales[0]) * largest(descales[1]) >= 0x1p91;
  }

  const auto same = [](std::int64_t i) { return i; };
  if (mode == Mode::Routed || mode == Mode::Ulysses) {
    // Each head against the mask this input gave it (decisions to run_routed, masks to a sequence-parallel
    // call: one for all heads, or one each), or a router's decision where one routed it; in the caller's
    // frame-major order. What the call reports it ran must be what it was given.
    require(std::int64_t(routes.size()) == layout.heads, "a routed call returned the wrong number of decisions");
    stsa::AttentionCall reference = call;
    std::vector<std::shared_ptr<const stsa::TilePlan>> head_plans;
    for (std::size_t h = 0; h < routes.size(); ++h) {
      const stsa::MaskSpec& spec = !given.empty()             ? given[h].spec
                                   : !ulysses.masks.empty() ? ulysses.masks[ulysses.masks.size() == 1 ? 0 : h]
                                                            : routes[h].spec;
      require(routes[h].spec == spec, "a call given its masks reports it ran others");
      require(given.empty() || routes[h].route == given[h].route, "run_routed reports routes other than given");
      reference.heads.push_back({spec, stsa::TokenOrder::FrameMajor, nullptr, true});
      head_plans.push_back(mode == Mode::Ulysses
                               ? plans.get(layout.grid, spec, ulysses.tile, ulysses.alignment)
                               : plans.get(layout.grid, spec, routed_options.tile, routed_options.alignment));
    }
    const auto predicate = [&](std::int64_t h, std::int64_t qp, std::int64_t kp) {
      return pair_computed(layout.grid, reference.heads[std::size_t(h)].spec, head_plans[std::size_t(h)].get(),
                           stsa::TokenOrder::FrameMajor, qp, kp);
    };
    check_outputs(reference, predicate, o, lse, same, same);
    return 0;
  }
  const auto predicate = [&](std::int64_t h, std::int64_t qp, std::int64_t kp) {
    const stsa::HeadMask& head = call.heads[std::size_t(h)];
    return pair_computed(layout.grid, head.spec, head.plan.get(), head.order, qp, kp);
  };
  if (mode == Mode::Direct) {
    check_outputs(call, predicate, o, lse, same, same);
    return 0;
  }
  // A gathered input's reference reads the rows gather_heads packs (the kernel read them in place).
  stsa::Tensor packed[3];
  if (gathered) {
    for (std::size_t i = 0; i < 3; ++i)
      packed[i] = stsa::Tensor(i == 1 ? k.view.dtype : q.view.dtype, layout.batch, layout.tokens(), layout.heads,
                               layout.head_dim);
    const stsa::TensorView q_source[] = {q.view}, q_packed[] = {packed[0].view()};
    const stsa::TensorView kv_sources[] = {k.view, v.view}, kv_packed[] = {packed[1].view(), packed[2].view()};
    // Each head's K/V head, by the definition: query head h reads K/V head h / (H / Hkv).
    std::vector<std::int64_t> kv_heads;
    for (const std::int64_t h : in_heads) kv_heads.push_back(h / (layout.heads / kv_layout.heads));
    stsa::gather_heads(layout.grid, gather.from, gather.to, in_heads, q_source, q_packed);
    stsa::gather_heads(layout.grid, gather.from, gather.to, kv_heads, kv_sources, kv_packed);
    const stsa::TensorView packed_views[] = {q_packed[0], kv_packed[0], kv_packed[1]};
    call.q = packed_views[0];
    call.k = packed_views[1];
    call.v = packed_views[2];
  }
  check_outputs(
      call, predicate, o, lse,
      [&](std::int64_t n) { return layout.grid.position(layout.grid.coord(n, scatter.from), scatter.to); },
      [&](std::int64_t h) { return out_heads[std::size_t(h)]; });
  return 0;
}
