// Fuzzes the attention call through the CPU backend, run() and run_scattered():
// small random layouts, dtypes, memory layouts, padded and strided tensors,
// masks, tile plans (exact and rounded), skipped heads, scales, instruction sets
// and thread counts, with a defect now and then (a wrong shape, a negative or
// overlapping stride, a misaligned or null pointer, an output over an input, a
// plan for another grid or mask or token order, a non-finite scale). Whatever the
// input:
//   - the call is refused with stsa::Error, or every computed head's O and LSE
//     agree with the fp64 reference (reference_rows: the mask from its
//     definition, or what a rounded plan claims to compute);
//   - a call carrying a defect is refused with InvalidArgument;
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
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "fuzz_reader.hpp"
#include "stsa/attention.hpp"
#include "stsa/cpu.hpp"
#include "stsa/error.hpp"
#include "stsa/reference.hpp"

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

std::int64_t reach(const std::int64_t* shape, const std::int64_t* stride, int rank) {
  std::int64_t last = 0;
  for (int i = 0; i < rank; ++i) last += std::max<std::int64_t>(shape[i] - 1, 0) * std::abs(stride[i]);
  return last + 1;
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

enum class Defect { None, Shape, NegativeStride, ZeroStride, Misaligned, Null };

// Picks a defect for a view now and then and applies the ones that change its
// shape or strides; the pointer defects are applied once the bytes exist.
template <std::size_t Rank>
Defect pick_defect(Reader& in, std::array<std::int64_t, Rank>& shape, std::array<std::int64_t, Rank>& stride,
                   bool allowed) {
  if (!allowed) return Defect::None;
  const auto defect = Defect(in.next(1, 5));
  const std::size_t dim = std::size_t(in.next(0, Rank - 1));
  switch (defect) {
    case Defect::Shape:
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
};

Tensor make_tensor(Reader& in, std::mt19937_64& rng, const stsa::VideoLayout& layout, stsa::DType dtype,
                   bool allow_defect, bool fill) {
  Tensor t;
  t.view = padded_view(in, layout, dtype);
  t.defect = pick_defect(in, t.view.shape, t.view.stride, allow_defect);
  const std::int64_t elements = reach(t.view.shape.data(), t.view.stride.data(), 4);
  const std::size_t size = std::size_t(elements) * stsa::element_size(dtype);
  t.buffer.bytes.resize(size + (t.defect == Defect::Misaligned ? 1 : 0));
  for (auto& byte : t.buffer.bytes) byte = std::byte(rng());  // padding holds garbage, never read
  void* data = t.buffer.bytes.data();
  // A negative stride walks down from the far end, as NumPy's reversed views do.
  std::int64_t first = 0;
  for (int i = 0; i < 4; ++i)
    if (t.view.stride[i] < 0) first += std::max<std::int64_t>(t.view.shape[i] - 1, 0) * -t.view.stride[i];
  data = static_cast<std::byte*>(data) + first * std::int64_t(stsa::element_size(dtype));
  if (fill && t.view.shape[0] > 0 && t.view.shape[1] > 0 && t.view.shape[2] > 0 && t.view.shape[3] > 0) {
    stsa::TensorView filled = t.view;
    filled.data = data;
    std::uniform_real_distribution<float> value(-1.f, 1.f);
    for (std::int64_t b = 0; b < filled.shape[0]; ++b)
      for (std::int64_t n = 0; n < filled.shape[1]; ++n)
        for (std::int64_t h = 0; h < filled.shape[2]; ++h)
          for (std::int64_t d = 0; d < filled.shape[3]; ++d) filled.store(b, n, h, d, value(rng));
  }
  apply_pointer_defect(t.defect, data);
  t.view.data = data;
  t.buffer.remember();
  return t;
}

struct Lse {
  Buffer buffer;
  stsa::LseView view;
  Defect defect = Defect::None;
};

Lse make_lse(Reader& in, std::mt19937_64& rng, const stsa::VideoLayout& layout, bool allow_defect) {
  Lse l;
  const std::int64_t n = std::max<std::int64_t>(layout.tokens(), 1), h = std::max<std::int64_t>(layout.heads, 1);
  const std::int64_t row = n + in.next(0, 2);
  l.view.shape = {layout.batch, layout.heads, layout.tokens()};
  l.view.stride = {h * row, row, 1};
  l.defect = pick_defect(in, l.view.shape, l.view.stride, allow_defect);
  const std::int64_t elements = reach(l.view.shape.data(), l.view.stride.data(), 3);
  l.buffer.bytes.resize(std::size_t(elements) * sizeof(float) + (l.defect == Defect::Misaligned ? 1 : 0));
  for (auto& byte : l.buffer.bytes) byte = std::byte(rng());
  void* data = l.buffer.bytes.data();
  std::int64_t first = 0;
  for (int i = 0; i < 3; ++i)
    if (l.view.stride[i] < 0) first += std::max<std::int64_t>(l.view.shape[i] - 1, 0) * -l.view.stride[i];
  data = static_cast<std::byte*>(data) + first * std::int64_t(sizeof(float));
  // A null LSE means "not wanted", so the null defect is not one here.
  if (l.defect == Defect::Null) l.defect = Defect::None;
  apply_pointer_defect(l.defect, data);
  l.view.data = static_cast<float*>(data);
  l.buffer.remember();
  return l;
}

stsa::DType pick_dtype(Reader& in) {
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
  switch (dtype) {
    case stsa::DType::BF16:
      return 1.f / 256;
    case stsa::DType::F16:
      return 1.f / 2048;
    default:
      return 0.f;
  }
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

// What the inputs came to, printed at exit: a run that compared nothing would show here.
struct Tally {
  long ran = 0, ran_scattered = 0, refused_invalid = 0, refused_unsupported = 0, defects_refused = 0;
  long compared_elements = 0;
  Tally() {
    std::atexit([] {
      const Tally& t = tally();
      std::fprintf(stderr,
                   "attention_fuzz: %ld calls ran (%ld scattered; %ld O elements checked against the reference), "
                   "%ld refused as invalid (%ld of them with a planted defect), %ld as unsupported\n",
                   t.ran, t.ran_scattered, t.compared_elements, t.refused_invalid, t.defects_refused,
                   t.refused_unsupported);
    });
  }
  static Tally& tally() {
    static Tally instance;
    return instance;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Reader in(data, size, /*random_tail=*/true);
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
  // 72 and 32 are valid layouts the CPU kernels do not take (Unsupported).
  constexpr std::int64_t head_dims[] = {64, 80, 96, 128, 64, 128, 72, 32, 0};
  layout.head_dim = head_dims[in.one_in(8) ? in.next(6, 8) : in.next(0, 5)];

  // At most one planted defect per input, so that every refusal of one is its own.
  enum class Plant { None, Q, K, V, O, Lse, KDtype, OverQ, LseOverO, ExtraHead, BadPlan, Scale, ScatterHeads, Count };
  const Plant plant = in.one_in(3) ? Plant(in.next(1, int(Plant::Count) - 1)) : Plant::None;
  bool must_refuse = false;

  const bool scattered = in.one_in(4);
  const stsa::DType input_dtype = pick_dtype(in);
  stsa::DType k_dtype = input_dtype;
  if (plant == Plant::KDtype) {
    k_dtype = stsa::DType((int(input_dtype) + in.next(1, 2)) % 3);
    must_refuse = true;
  }
  Tensor q = make_tensor(in, rng, layout, input_dtype, plant == Plant::Q, true);
  Tensor k = make_tensor(in, rng, layout, k_dtype, plant == Plant::K, true);
  Tensor v = make_tensor(in, rng, layout, input_dtype, plant == Plant::V, true);
  must_refuse |= q.defect != Defect::None || k.defect != Defect::None || v.defect != Defect::None;

  // The output: the call's own [B, N, H, D] O, or a larger tensor its heads scatter into.
  stsa::VideoLayout out_layout = layout;
  std::vector<std::int64_t> out_heads;
  stsa::ScatteredOutput scatter;
  if (scattered) {
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
  Tensor o = make_tensor(in, rng, out_layout, pick_dtype(in), plant == Plant::O, false);
  must_refuse |= o.defect != Defect::None;
  if (plant == Plant::OverQ) {  // O written over Q's bytes
    o.view.data = q.view.data;
    must_refuse = true;
  }
  Lse lse;
  if (plant == Plant::Lse || plant == Plant::LseOverO || in.next(0, 1)) {
    lse = make_lse(in, rng, out_layout, plant == Plant::Lse);
    must_refuse |= lse.defect != Defect::None;
    if (plant == Plant::LseOverO) {  // LSE over O's bytes
      lse.view.data = static_cast<float*>(o.view.data);
      must_refuse = true;
    }
  }

  Heads heads = make_heads(in, layout, plant == Plant::ExtraHead, plant == Plant::BadPlan);
  must_refuse |= heads.defect;

  stsa::AttentionCall call;
  call.layout = layout;
  call.q = q.view;
  call.k = k.view;
  call.v = v.view;
  call.heads = heads.masks;
  if (plant == Plant::Scale) {
    call.softmax_scale = in.next(0, 1) ? NAN : -INFINITY;
    must_refuse = true;
  } else if (in.next(0, 1)) {  // else 0: the default, 1 / sqrt(D)
    call.softmax_scale = float(in.next(-300, 300)) / 100.f / std::sqrt(float(std::max<std::int64_t>(layout.head_dim, 1)));
  }
  if (scattered) {
    scatter.grid = layout.grid;
    scatter.from = in.next(0, 1) ? stsa::TokenOrder::SpatialMajor : stsa::TokenOrder::FrameMajor;
    scatter.to = in.next(0, 1) ? stsa::TokenOrder::SpatialMajor : stsa::TokenOrder::FrameMajor;
    scatter.heads = out_heads;
    scatter.o = o.view;
    scatter.lse = lse.view;
    // Every computed head's tokens must be in the order the scatter reads.
    for (const auto& head : call.heads) must_refuse |= head.compute && head.order != scatter.from;
  } else {
    call.o = o.view;
    call.lse = lse.view;
  }

  constexpr stsa::Isa isas[] = {stsa::Isa::Auto, stsa::Isa::Scalar, stsa::Isa::Avx2, stsa::Isa::Avx512,
                                stsa::Isa::Amx};
  const stsa::Backend& backend = cpu_backend(isas[in.next(0, 4)], int(in.next(1, 3)));

  Tally& tally = Tally::tally();
  bool ran = false;
  try {
    if (scattered)
      backend.run_scattered(call, scatter);
    else
      backend.run(call);
    ran = true;
  } catch (const stsa::InvalidArgument&) {
    ++tally.refused_invalid;
    tally.defects_refused += must_refuse;
  } catch (const stsa::Unsupported&) {
    require(!must_refuse, "a defective call was refused as unsupported, not as invalid");
    ++tally.refused_unsupported;
  }
  require(q.buffer.unchanged() && k.buffer.unchanged() && v.buffer.unchanged(), "an input was written");
  if (!ran) {
    require(o.buffer.unchanged() && lse.buffer.unchanged(), "a refused call wrote its output");
    return 0;
  }
  require(!must_refuse, "a defective call ran");
  ++tally.ran;
  tally.ran_scattered += scattered;

  // The fp64 reference of every row, into its own buffers.
  const auto predicate = [&](std::int64_t h, std::int64_t qp, std::int64_t kp) {
    const stsa::HeadMask& head = call.heads[std::size_t(h)];
    if (head.plan != nullptr && head.plan->alignment() == stsa::Alignment::Round) return head.plan->computes(qp, kp);
    return stsa::allowed_at(layout.grid, head.spec, head.order, qp, kp);
  };
  std::vector<float> reference_out(std::size_t(layout.batch * layout.tokens() * layout.heads * layout.head_dim));
  stsa::AttentionCall reference_call = call;
  reference_call.o = stsa::TensorView::contiguous(reference_out.data(), stsa::DType::F32, layout.batch,
                                                  layout.tokens(), layout.heads, layout.head_dim,
                                                  stsa::MemoryLayout::BNHD);
  reference_call.lse = {};
  std::vector<std::int64_t> rows(std::size_t(layout.tokens()));
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<double> expected_o, expected_lse;
  stsa::reference_rows(reference_call, rows, expected_o, expected_lse, predicate);

  // Where row n of call head h went, and the largest |v| (the scale of O's error).
  const auto out_row = [&](std::int64_t n) {
    return scattered && scatter.from != scatter.to ? layout.grid.position(layout.grid.coord(n, scatter.from), scatter.to)
                                                   : n;
  };
  const auto out_head = [&](std::int64_t h) { return scattered ? out_heads[std::size_t(h)] : h; };
  std::vector<bool> o_written(o.buffer.bytes.size()), lse_written(lse.buffer.bytes.size());
  const float o_rounding = out_rounding(o.view.dtype);
  const std::int64_t n_tokens = layout.tokens(), d_count = layout.head_dim;
  for (std::int64_t b = 0; b < layout.batch; ++b)
    for (std::int64_t h = 0; h < layout.heads; ++h) {
      if (!call.heads[std::size_t(h)].compute) continue;
      for (std::int64_t n = 0; n < n_tokens; ++n) {
        const std::int64_t row = out_row(n), head = out_head(h);
        for (std::int64_t d = 0; d < d_count; ++d) {
          const double want = expected_o[std::size_t(((b * n_tokens + n) * layout.heads + h) * d_count + d)];
          const double got = o.view.load(b, row, head, d);
          // fp32 scores below ~35 in magnitude (|q|, |k| <= 1 per channel), |v| <= 1, then the output's rounding.
          require(std::abs(got - want) <= 1e-3 + o_rounding * std::abs(want), "O differs from the reference");
          mark(o.view, o.buffer, o_written, b, row, head, d);
          ++tally.compared_elements;
        }
        if (lse.view.data == nullptr) continue;
        const double want = expected_lse[std::size_t((b * layout.heads + h) * n_tokens + n)];
        const float* at = &lse.view.at(b, head, row);
        const double got = *at;
        if (std::isinf(want))
          require(got == want, "LSE of a row without keys differs from the reference");
        else
          require(std::abs(got - want) <= 5e-4 * (1 + std::abs(want)), "LSE differs from the reference");
        const std::size_t first = std::size_t(reinterpret_cast<const std::byte*>(at) - lse.buffer.bytes.data());
        for (std::size_t i = 0; i < sizeof(float); ++i) lse_written[first + i] = true;
      }
    }
  require(only_marked_changed(o.buffer, o_written), "O bytes outside the computed heads' elements were written");
  require(lse.view.data == nullptr || only_marked_changed(lse.buffer, lse_written),
          "LSE bytes outside the computed heads' rows were written");
  return 0;
}
