// The CPU backend: checks the call, packs K/V of each (batch, head) once, and
// spreads (batch, head, query tile) work items over a thread pool; the math is
// in kernel_impl.hpp, compiled per instruction set, and in kernel_amx.cpp.
#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "core/round_up.hpp"
#include "cpu/isa.hpp"
#include "cpu/kernel.hpp"
#include "cpu/pack.hpp"
#include "cpu/thread_pool.hpp"
#include "stsa/cpu.hpp"
#include "stsa/error.hpp"

namespace stsa {
namespace cpu {
namespace {

// K/V panels of the (batch, head) pairs packed at once stay under this (one pair always fits).
constexpr std::int64_t kPanelBudgetBytes = std::int64_t(128) << 20;

// 64-byte aligned storage (whole cache lines for the SIMD loads); grows, never shrinks.
template <class T>
class AlignedBuffer {
 public:
  void resize(std::int64_t count) {
    if (count <= size_) return;
    const std::size_t bytes = (std::size_t(count) * sizeof(T) + 63) / 64 * 64;
    T* p = static_cast<T*>(std::aligned_alloc(64, bytes));
    if (p == nullptr) throw ResourceError(detail::concat("cpu backend: cannot allocate ", bytes, " bytes"));
    data_.reset(p);
    size_ = count;
  }
  T* data() const { return data_.get(); }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  std::int64_t size_ = 0;
};
using FloatBuffer = AlignedBuffer<float>;
using PairBuffer = AlignedBuffer<std::uint32_t>;  // bf16 pairs (pack.hpp: bf16_pair)
using Bf16Buffer = AlignedBuffer<std::uint16_t>;

// A kernel and the head dim it runs a call at: the call's, or the next larger
// one it is built for, the channels between packed as zeros (pack.hpp).
struct Kernel {
  AttendFn attend = nullptr;  // null: no kernel takes this head dim
  std::int64_t dim = 0;
};

Kernel padded_kernel(AttendFn (*kernel_of)(int), std::int64_t head_dim) {
  for (std::int64_t dim = std::max<std::int64_t>(head_dim, 1); dim <= kMaxHeadDim; ++dim)
    if (AttendFn attend = kernel_of(int(dim))) return {attend, dim};
  return {};
}

// The SIMD kernels of `isa` by head dim; with Amx, the AVX-512 ones, which run every call the tile
// kernel does not take.
AttendFn (*simd_kernels(Isa isa))(int) {
  switch (isa) {
    case Isa::Amx:
    case Isa::Avx512: return attend_avx512;
    case Isa::Avx2: return attend_avx2;
    default: return attend_scalar;
  }
}

Kernel simd_kernel(Isa isa, std::int64_t head_dim) { return padded_kernel(simd_kernels(isa), head_dim); }

// The kernel that computes `call` under `isa` (resolved, not Auto) and the head dim it runs at: the
// AMX tile kernel for what it takes, else the SIMD kernel (AVX-512 under Amx). The one place the
// backend, kernel_isa and kernel_head_dim choose it.
struct KernelChoice {
  Isa isa;
  Kernel kernel;
};
// Whether head h's Q K^T may come from bf16 products on the pair and tile paths: its
// inputs are not bf16, or its scale times its q and k descales is below
// kBf16PairScoreScaleLimit for every batch entry. Reads only the descales given (where
// they are not B x H, in a call not validated, the largest of them stands for each), so
// kernel_isa can ask it of any call.
bool head_takes_bf16_products(const AttentionCall& call, std::int64_t h) {
  if (call.q.dtype != DType::BF16) return true;
  const std::int64_t batch = call.layout.batch, heads = call.layout.heads;
  const auto factor = [&](std::span<const float> descales, std::int64_t b) {
    if (descales.empty()) return 1.0;
    if (std::int64_t(descales.size()) == batch * heads && h < heads)
      return std::abs(double(descales[std::size_t(b * heads + h)]));
    return std::abs(double(*std::ranges::max_element(descales)));
  };
  for (std::int64_t b = 0; b < std::max<std::int64_t>(batch, 1); ++b)
    if (std::abs(double(call.scale())) * factor(call.descales.q, b) * factor(call.descales.k, b) >=
        kBf16PairScoreScaleLimit)
      return false;
  return true;
}

// Whether every head `call` computes takes bf16 products (head_takes_bf16_products).
bool bf16_products_apply(const AttentionCall& call) {
  for (std::size_t h = 0; h < call.heads.size(); ++h)
    if (call.heads[h].compute && !head_takes_bf16_products(call, std::int64_t(h))) return false;
  return true;
}

// Which of the kernel's products take bf16 pairs for a call whose output is `out`.
struct PairPaths {
  int in_parts = 1;         // 2: fp16 values split into two bf16 parts (the AMX kernel)
  bool qk = false;          // S = Q K^T from bf16 pairs (VDPBF16PS or tile products)
  bool pv_avx512 = false;   // the AVX-512 kernel's O += P V from bf16 pairs too (P rounded to bf16)
  bool v = false;           // V packed as bf16 pairs of keys (the AMX kernel, or pv_avx512)
};
// bf16 inputs on AVX-512 (which here includes BF16) compute S = Q K^T from bf16
// pairs with VDPBF16PS or tile products: the values are exact either way, the products too
// (but for those under 2^-126, which only a score scale past kBf16PairScoreScaleLimit would
// make matter: such a call takes fp32 rows). fp8 ones do too, as their values' bf16 bits
// (exact; no product of two fp8 values is below 2^-18). fp16 inputs on the AMX kernel do too,
// each value split into two bf16 parts.
// bf16 (or fp8) in and bf16 out on AVX-512 without the tile unit: O += P V with VDPBF16PS
// too, from P rounded to bf16 (as the AMX kernel does for these calls) and V's pairs of
// keys: twice the products per instruction, for an output rounded to bf16 anyway.
PairPaths pair_paths(Isa isa, bool amx, const AttentionCall& call, DType out) {
  PairPaths paths;
  paths.in_parts = amx && call.q.dtype == DType::F16 ? 2 : 1;
  const bool fp8_qk = call.q.dtype == DType::F8E4M3 && call.k.dtype == DType::F8E4M3;
  const bool bf16_qk = call.q.dtype == DType::BF16 && call.k.dtype == DType::BF16 && bf16_products_apply(call);
  paths.qk = paths.in_parts == 2 || (isa >= Isa::Avx512 && (fp8_qk || bf16_qk));
  paths.pv_avx512 = !amx && paths.qk && (call.v.dtype == DType::BF16 || call.v.dtype == DType::F8E4M3) &&
                    out == DType::BF16;
  paths.v = amx || paths.pv_avx512;
  return paths;
}

KernelChoice choose_kernel(Isa isa, const AttentionCall& call) {
  const std::int64_t head_dim = call.layout.head_dim;
  if (isa != Isa::Amx) return {isa, simd_kernel(isa, head_dim)};
  // The tile products read V as bf16 pairs too, so all three must be bf16 (exact),
  // all three fp16 (each split into two bf16 parts, exactly) or all three fp8
  // (converted to bf16, exactly). A head dim it is not built for runs padded to the
  // next one it is (D = 80 at 96: 3.2x the AVX-512 kernel's speed; bench/NOTES.md, session 45).
  const DType in = call.q.dtype;
  if ((in == DType::BF16 || in == DType::F16 || in == DType::F8E4M3) && call.k.dtype == in && call.v.dtype == in &&
      bf16_products_apply(call))
    if (const Kernel tiles = padded_kernel(attend_amx, head_dim); tiles.attend != nullptr) return {Isa::Amx, tiles};
  return {Isa::Avx512, simd_kernel(Isa::Avx512, head_dim)};
}

// The largest head dim a SIMD kernel of `isa` is built for: every one up to it runs (for the refusal's message).
std::int64_t largest_kernel_dim(Isa isa) {
  for (std::int64_t dim = kMaxHeadDim; dim > 0; --dim)
    if (simd_kernels(isa)(int(dim)) != nullptr) return dim;
  return 0;
}

// One (batch, head) to compute, and where its packed K/V live.
struct PairWork {
  std::int64_t batch = 0, head = 0;
  const TilePlan* plan = nullptr;
  // Offsets into the chunk's buffers: the fp32 Kt panel (absent when K is packed
  // as bf16 pairs) and the V panel in floats; the bf16-pair K and V panels in
  // words (V pairs only for kernels that take P V from bf16 pairs).
  std::int64_t kt_offset = 0, v_offset = 0, pair_offset = 0, v_pair_offset = 0;
  // The pair whose panels these are (itself, or an earlier pair of the chunk reading the
  // same K/V head: grouped-query attention packs a K/V head once for its query heads).
  std::size_t panels_of = 0;
  bool v_nonfinite = false, v_tiny = false, k_nonfinite = false;
};

struct TileItem {
  std::int32_t pair = 0;
  std::int32_t q_tile = 0;
  double cost = 0;
};

struct WorkerScratch {
  FloatBuffer q, o, m, l, s;
  PairBuffer q_pairs;
  Bf16Buffer p_parts;  // the AMX kernel's split P
  PairBuffer p_pairs;  // the AVX-512 kernel's P as bf16 pairs (bf16 or fp8 in, bf16 out)
  std::vector<const std::uint64_t*> masks;
};

// An earlier pair of the chunk [first, last) whose panels pair `last` can read: the
// same batch entry, K/V head and key tiles (grouped-query attention), or none.
std::optional<std::size_t> panels_to_share(const RowSource& in, const std::vector<PairWork>& pairs,
                                           std::size_t first, std::size_t last) {
  const PairWork& pw = pairs[last];
  for (std::size_t p = last; p-- > first;) {
    const PairWork& other = pairs[p];
    if (other.batch != pw.batch) break;  // pairs go batch entry by batch entry
    if (other.panels_of == p && in.kv_head(other.head) == in.kv_head(pw.head) &&
        other.plan->tile().k == pw.plan->tile().k && other.plan->k_tiles() == pw.plan->k_tiles())
      return p;
  }
  return std::nullopt;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(CpuOptions options) : requested_(options) {}

  std::string_view name() const override { return "cpu"; }

  Support supports(const AttentionCall& call) const override { return supports(call, configuration()); }

  void run(const AttentionCall& call) const override {
    validate(call, /*require_plans=*/true);
    run_checked(call, RowSource{call.q, call.k, call.v}, RowDestination{call.o, call.lse});
  }

  bool runs_scattered() const override { return true; }

  void run_scattered(const AttentionCall& call, const ScatteredOutput& out) const override {
    validate(scattered_call_for_checks(call, out), /*require_plans=*/true);
    const std::vector<std::int64_t> tokens = token_map(out.grid, out.from, out.to, "scattered output");
    run_checked(call, RowSource{call.q, call.k, call.v},
                RowDestination{out.o, out.lse, out.heads.data(), tokens.empty() ? nullptr : tokens.data()});
  }

  bool runs_gathered() const override { return true; }

  void run_gathered(const AttentionCall& call, const GatheredInput& in, const ScatteredOutput& out) const override {
    const AttentionCall checked = gathered_call_for_checks(call, in, out);
    validate(checked, /*require_plans=*/true);
    // The call's output row n lands at token tokens[n]; its row n is source token rows[n], the same
    // map where the output goes back to the inputs' order (routed attention's temporal heads).
    const std::vector<std::int64_t> tokens = token_map(out.grid, out.from, out.to, "scattered output");
    const bool same_map = in.to == out.from && in.from == out.to;
    const std::vector<std::int64_t> rows = same_map ? std::vector<std::int64_t>{}
                                                    : token_map(in.grid, in.to, in.from, "gathered input");
    const std::vector<std::int64_t>& row_map = same_map ? tokens : rows;
    run_checked(checked, RowSource{in.q, in.k, in.v, in.heads.data(), row_map.empty() ? nullptr : row_map.data()},
                RowDestination{out.o, out.lse, out.heads.data(), tokens.empty() ? nullptr : tokens.data()});
  }

 private:
  // Position n in order `from` -> its position in order `to`; empty where the orders agree.
  static std::vector<std::int64_t> token_map(const VideoGrid& grid, TokenOrder from, TokenOrder to, const char* what) {
    std::vector<std::int64_t> map;
    if (from == to) return map;
    try {
      map.resize(std::size_t(grid.tokens()));
    } catch (const std::bad_alloc&) {
      throw ResourceError(detail::concat("cpu backend: out of memory for the ", what, "'s token map"));
    }
    for (std::int64_t n = 0; n < grid.tokens(); ++n) map[std::size_t(n)] = grid.position(grid.coord(n, from), to);
    return map;
  }

  // What this call runs with: Auto and 0 resolved now (cpu_defaults and the environment may have changed).
  struct Configuration {
    Isa isa = Isa::Scalar;
    int threads = 1;
    std::string error;  // why the backend cannot run at all
    bool malformed = false;  // that is a malformed STSA_ISA or STSA_THREADS: InvalidArgument, not Unsupported
  };
  Configuration configuration() const {
    Configuration c;
    const CpuOptions defaults = cpu_defaults();  // one read: both fields of one set_cpu_defaults
    const IsaChoice isa = choose_isa(requested_.isa, defaults);
    c.isa = isa.isa;
    c.threads = threads_from(requested_.threads, defaults, c.error);
    c.malformed = !c.error.empty();  // threads_from's only error is a malformed STSA_THREADS
    if (!isa.why.empty()) c.error = isa.why, c.malformed = isa.malformed;
    return c;
  }

  static Support supports(const AttentionCall& call, const Configuration& c) {
    if (!c.error.empty()) return {false, "cpu backend: " + c.error};
    if (choose_kernel(c.isa, call).kernel.attend == nullptr)
      return {false, detail::concat("cpu backend supports head dims 1 to ", largest_kernel_dim(c.isa), ", got ",
                                    call.layout.head_dim)};
    return {};
  }

  // `call` gives the layout, dtypes, heads and scale; its rows are read from `in` and stored to `out`.
  void run_checked(const AttentionCall& call, const RowSource& in, const RowDestination& out) const {
    const Configuration config = configuration();
    const Support support = supports(call, config);
    if (!support.ok && config.malformed) throw InvalidArgument(support.why);
    if (!support.ok) throw Unsupported(support.why);
    std::lock_guard<std::mutex> lock(mutex_);
    // A pool inherited through fork() has no workers in this process: a fresh one gets them back.
    if (!pool_ || pool_threads_ != config.threads || !pool_->owned_by_this_process()) {
      pool_.reset();  // its workers end before the new pool's start (a forked child's is left alone)
      pool_ = std::make_unique<ThreadPool>(config.threads);
      pool_threads_ = config.threads;
    }
    // The helpers around the kernel keep to its instruction set too.
    RowSource capped_in = in;
    RowDestination capped_out = out;
    capped_in.vector_cap = capped_out.vector_cap = config.isa;
    try {
      compute(call, config.isa, capped_in, capped_out);
    } catch (const std::bad_alloc&) {
      throw ResourceError("cpu backend: out of memory for the packed K/V panels or scratch buffers");
    }
  }

  // A bf16 call whose heads differ in whether their descales let Q K^T come from bf16
  // products runs as two passes, each head with what its own descales allow: its bits
  // never depend on the heads beside it (a Ulysses rank holding it alone gets them too).
  void compute(const AttentionCall& call, Isa isa, const RowSource& in, const RowDestination& out) const {
    std::vector<std::uint8_t> pairs(call.heads.size());  // per computed head: head_takes_bf16_products
    bool any_pairs = false, any_fp32 = false;
    for (std::size_t h = 0; h < call.heads.size(); ++h) {
      if (!call.heads[h].compute) continue;
      pairs[h] = head_takes_bf16_products(call, std::int64_t(h));
      (pairs[h] ? any_pairs : any_fp32) = true;
    }
    if (!any_pairs || !any_fp32) return compute_heads(call, isa, in, out);
    AttentionCall pair_heads = call, fp32_heads = call;
    for (std::size_t h = 0; h < call.heads.size(); ++h)
      if (call.heads[h].compute) (pairs[h] ? fp32_heads : pair_heads).heads[h].compute = false;
    compute_heads(pair_heads, isa, in, out);
    compute_heads(fp32_heads, isa, in, out);
  }

  void compute_heads(const AttentionCall& call, Isa isa, const RowSource& in, const RowDestination& out) const {
    const VideoLayout& layout = call.layout;
    const KernelChoice choice = choose_kernel(isa, call);
    const bool amx = choice.isa == Isa::Amx;
    const Kernel& kernel = choice.kernel;
    // Every panel and row buffer below has the kernel's channels (the head's, then zeros).
    const std::int64_t d = kernel.dim;
    // Q only takes the scale's sign (exact; descales are positive); its magnitude, with
    // the (batch, head)'s descales, goes into the kernel's exp2.
    const float q_scale = call.scale() < 0 ? -1.0f : 1.0f;
    const PairPaths paths = pair_paths(isa, amx, call, out.o.dtype);
    const int in_parts = paths.in_parts;
    const bool bf16_pairs = paths.qk;

    std::vector<PairWork> pairs;
    for (std::int64_t b = 0; b < layout.batch; ++b)
      for (std::int64_t h = 0; h < layout.heads; ++h)
        if (call.heads[std::size_t(h)].compute) pairs.push_back({b, h, call.heads[std::size_t(h)].plan.get()});

    // Scratch sized for the largest tile shape any head uses.
    std::int64_t max_q = 1, max_k = 64, max_partial = 0;
    for (const auto& p : pairs) {
      max_q = std::max<std::int64_t>(max_q, p.plan->tile().q);
      max_k = std::max<std::int64_t>(max_k, p.plan->tile().k);
      for (std::int64_t t = 0; t < p.plan->q_tiles(); ++t)
        max_partial = std::max<std::int64_t>(max_partial, std::int64_t(p.plan->partial_tiles(t).size()));
    }
    std::vector<WorkerScratch>& scratch = scratch_;
    scratch.resize(std::size_t(pool_->size()));
    // The AMX kernel reads and writes whole tiles of rows.
    const std::int64_t max_rows = amx ? round_up(max_q, kAmxRowPad) : max_q;
    for (auto& w : scratch) {
      if (!bf16_pairs) w.q.resize(max_q * d);
      w.o.resize(max_rows * d);
      w.m.resize(max_q);
      w.l.resize(max_q);
      w.s.resize(std::int64_t(amx ? std::max(kScratchRows, kAmxScratchRows) : kScratchRows) * max_k);
      if (bf16_pairs) w.q_pairs.resize(max_rows * d / 2 * in_parts);
      if (paths.pv_avx512) w.p_pairs.resize(std::int64_t(kScratchRows) * max_k / 2);
      if (amx) w.p_parts.resize(std::int64_t(kAmxPartRows) * max_k);
      if (w.masks.size() < std::size_t(max_partial)) w.masks.resize(std::size_t(max_partial));
    }

    FloatBuffer& panels = panels_;
    std::size_t first = 0;
    while (first < pairs.size()) {
      // A chunk of pairs whose panels fit the budget.
      std::size_t last = first;
      std::int64_t floats = 0, pair_words = 0;
      while (last < pairs.size()) {
        const TilePlan& plan = *pairs[last].plan;
        pairs[last].panels_of = last;
        if (const std::optional<std::size_t> owner = panels_to_share(in, pairs, first, last)) {
          PairWork& pw = pairs[last];
          const PairWork& from = pairs[*owner];
          pw.panels_of = *owner;
          pw.kt_offset = from.kt_offset, pw.v_offset = from.v_offset;
          pw.pair_offset = from.pair_offset, pw.v_pair_offset = from.v_pair_offset;
          ++last;
          continue;
        }
        const std::int64_t panel = plan.k_tiles() * plan.tile().k * d;  // elements of K (or V) for all key tiles
        const std::int64_t kt_floats = bf16_pairs ? 0 : panel;
        const std::int64_t k_words = bf16_pairs ? panel / 2 * in_parts : 0;
        const std::int64_t v_words = paths.v ? panel / 2 * in_parts : 0;
        const std::int64_t bytes =
            (floats + kt_floats + panel + pair_words + k_words + v_words) * std::int64_t(sizeof(float));
        if (last > first && bytes > kPanelBudgetBytes) break;
        pairs[last].kt_offset = floats;
        pairs[last].v_offset = floats + kt_floats;
        pairs[last].pair_offset = pair_words;
        pairs[last].v_pair_offset = pair_words + k_words;
        floats += kt_floats + panel;
        pair_words += k_words + v_words;
        ++last;
      }
      panels.resize(floats);
      if (bf16_pairs) pair_panels_.resize(pair_words);
      run_chunk(call, in, out, pairs, first, last, panels.data(), bf16_pairs ? pair_panels_.data() : nullptr, amx,
                paths, kernel, q_scale, scratch);
      first = last;
    }
  }

  // pair_panels: bf16-pair K panels (S = Q K^T from bf16 pairs), and with paths.v
  // the V ones too; nullptr for the fp32 path.
  void run_chunk(const AttentionCall& call, const RowSource& in, const RowDestination& out,
                 std::vector<PairWork>& pairs, std::size_t first, std::size_t last, float* panels,
                 std::uint32_t* pair_panels, bool amx, const PairPaths& paths, const Kernel& kernel, float q_scale,
                 std::vector<WorkerScratch>& scratch) const {
    const int in_parts = paths.in_parts;
    const std::int64_t d = kernel.dim;  // the kernel's channels: the head's, then zeros
    const std::int64_t n = call.layout.tokens();

    // Phase 1: pack the key tiles some query tile uses, each once (once for all the
    // pairs that share their panels).
    struct PackItem {
      std::size_t pair;
      std::int32_t tile;
    };
    std::vector<PackItem> packs;
    std::vector<std::vector<char>> used(last - first);  // per owner of panels: its key tiles some pair uses
    for (std::size_t p = first; p < last; ++p) {
      const TilePlan& plan = *pairs[p].plan;
      std::vector<char>& tiles = used[pairs[p].panels_of - first];
      tiles.resize(std::size_t(plan.k_tiles()), 0);
      for (std::int64_t t = 0; t < plan.q_tiles(); ++t) {
        for (std::int32_t k : plan.full_tiles(t)) tiles[std::size_t(k)] = 1;
        for (std::int32_t k : plan.partial_tiles(t)) tiles[std::size_t(k)] = 1;
      }
    }
    for (std::size_t p = first; p < last; ++p)
      for (std::size_t k = 0; k < used[p - first].size(); ++k)
        if (used[p - first][k]) packs.push_back({p, std::int32_t(k)});
    std::vector<KvFlags> packed(packs.size());
    pool_->parallel_for(std::int64_t(packs.size()), [&](std::int64_t i, int) {
      const PairWork& pw = pairs[packs[std::size_t(i)].pair];
      const std::int64_t tile_k = pw.plan->tile().k;
      const std::int64_t tile = packs[std::size_t(i)].tile;
      float* kt = pair_panels ? nullptr : panels + pw.kt_offset + tile * d * tile_k;
      // Kernels given V's pairs read fp32 V only for heads with Inf, NaN or tiny V: made below where needed.
      float* v = paths.v ? nullptr : panels + pw.v_offset + tile * tile_k * d;
      std::uint32_t* kt_pairs =
          pair_panels ? pair_panels + pw.pair_offset + tile * in_parts * d / 2 * tile_k : nullptr;
      std::uint32_t* v_pair_panel =
          paths.v ? pair_panels + pw.v_pair_offset + tile * in_parts * tile_k / 2 * d : nullptr;
      packed[std::size_t(i)] =
          pack_kv_tile(in, pw.batch, pw.head, tile, int(tile_k), kt, v, kt_pairs, v_pair_panel, d);
    });
    for (std::size_t i = 0; i < packs.size(); ++i) {
      pairs[packs[i].pair].v_nonfinite |= packed[i].nonfinite;
      pairs[packs[i].pair].v_tiny |= packed[i].tiny;
      pairs[packs[i].pair].k_nonfinite |= packed[i].k_nonfinite;
    }
    for (std::size_t p = first; p < last; ++p) {  // what the panels hold, for every pair reading them
      const PairWork& owner = pairs[pairs[p].panels_of];
      pairs[p].v_nonfinite = owner.v_nonfinite, pairs[p].v_tiny = owner.v_tiny;
      pairs[p].k_nonfinite = owner.k_nonfinite;
    }
    if (paths.v)
      for (const PackItem& item : packs) {
        const PairWork& pw = pairs[item.pair];
        if (!pw.v_nonfinite && !pw.v_tiny) continue;
        const std::int64_t tile_k = pw.plan->tile().k;
        unpack_v_pairs(pair_panels + pw.v_pair_offset + item.tile * in_parts * tile_k / 2 * d, int(tile_k), d,
                       in_parts, panels + pw.v_offset + item.tile * tile_k * d);
      }

    // Phase 2: every query tile of the chunk, most kept tiles first so the tail of the loop is short.
    std::vector<TileItem> items;
    for (std::size_t p = first; p < last; ++p) {
      const TilePlan& plan = *pairs[p].plan;
      for (std::int64_t t = 0; t < plan.q_tiles(); ++t) {
        const double rows = double(std::min<std::int64_t>(plan.tile().q, n - t * plan.tile().q));
        const double tiles = double(plan.full_tiles(t).size()) + 1.25 * double(plan.partial_tiles(t).size());
        items.push_back({std::int32_t(p), std::int32_t(t), rows * (tiles + 0.05)});
      }
    }
    std::stable_sort(items.begin(), items.end(), [](const TileItem& a, const TileItem& b) { return a.cost > b.cost; });

    pool_->parallel_for(std::int64_t(items.size()), [&](std::int64_t i, int worker) {
      const TileItem& item = items[std::size_t(i)];
      const PairWork& pw = pairs[std::size_t(item.pair)];
      const TilePlan& plan = *pw.plan;
      WorkerScratch& w = scratch[std::size_t(worker)];
      const std::int64_t tile_q = plan.tile().q, tile_k = plan.tile().k;
      const std::int64_t q0 = std::int64_t(item.q_tile) * tile_q;
      const int rows = int(std::min<std::int64_t>(tile_q, n - q0));
      // Q as fp32 rows, or for the bf16 dot products as its own bf16 pairs (fp16: those of its two parts).
      const std::int64_t q_head = in.head(pw.head);
      const std::int64_t q_row_words = in_parts * d / 2;
      bool q_nonfinite = false;
      for (int r = 0; r < rows; ++r) {
        if (r + kPrefetchRowsAhead < rows) prefetch_row(in.q, pw.batch, in.token(q0 + r + kPrefetchRowsAhead), q_head);
        const std::int64_t token = in.token(q0 + r);
        if (in_parts == 2)
          q_nonfinite |= load_row_split_pairs(in.q, pw.batch, token, q_head, q_scale < 0,
                                              w.q_pairs.data() + r * q_row_words, d);
        else if (pair_panels != nullptr)
          load_row_pairs(in.q, pw.batch, token, q_head, q_scale < 0, w.q_pairs.data() + r * q_row_words, d);
        else
          load_row(in.q, pw.batch, token, q_head, q_scale, w.q.data() + r * d, d, in.vector_cap);
      }
      if (amx)
        std::fill(w.q_pairs.data() + rows * q_row_words, w.q_pairs.data() + round_up(rows, kAmxRowPad) * q_row_words,
                  0u);

      const auto full = plan.full_tiles(item.q_tile);
      const auto partial = plan.partial_tiles(item.q_tile);
      const auto ids = plan.partial_mask_ids(item.q_tile);
      for (std::size_t j = 0; j < partial.size(); ++j) w.masks[j] = plan.mask(ids[j]);

      const double score_scale = std::abs(call.score_scale(pw.batch, pw.head));
      QueryTileJob job;
      job.q = pair_panels ? nullptr : w.q.data();
      job.exp_scale = float(score_scale * 1.44269504088896340736);
      job.rows = rows;
      job.tile_k = int(tile_k);
      job.tokens = n;
      job.kv.kt = pair_panels ? nullptr : panels + pw.kt_offset;
      job.kv.v = panels + pw.v_offset;
      job.kv.v_nonfinite = pw.v_nonfinite;
      job.kv.v_tiny = pw.v_tiny;
      if (pair_panels != nullptr) {
        job.q_pairs = w.q_pairs.data();
        job.kv.kt_pairs = pair_panels + pw.pair_offset;
      }
      if (paths.v) job.kv.v_pairs = pair_panels + pw.v_pair_offset;
      if (paths.pv_avx512) job.p_pairs = w.p_pairs.data();
      if (amx) {
        job.p_parts = w.p_parts.data();
        const DType out_dtype = out.o.dtype;
        job.p_part_count = out_dtype == DType::F32 ? 3 : out_dtype == DType::BF16 && in_parts == 1 ? 1 : 2;
        job.input_parts = in_parts;
        job.qk_nonfinite = q_nonfinite || pw.k_nonfinite;
      }
      job.full = full.data();
      job.n_full = int(full.size());
      job.partial = partial.data();
      job.partial_masks = w.masks.data();
      job.n_partial = int(partial.size());
      job.mask_words = plan.mask_words_per_row();
      job.o = w.o.data();
      job.m = w.m.data();
      job.l = w.l.data();
      job.scratch = w.s.data();
      kernel.attend(job);
      store_rows(out, pw.batch, pw.head, q0, rows, job.o, job.m, job.l, score_scale,
                 float(call.descales.out(pw.batch, pw.head, call.layout.heads)), d);
    });
  }

  CpuOptions requested_;
  mutable std::mutex mutex_;
  // Started on the first run, again when the thread count changes and in a forked child.
  mutable std::unique_ptr<ThreadPool> pool_;
  mutable int pool_threads_ = 0;              // the count pool_ was asked for (it may run fewer)
  // Kept across runs (guarded by mutex_): fresh pages would be faulted in on every call.
  mutable FloatBuffer panels_;
  mutable PairBuffer pair_panels_;
  mutable std::vector<WorkerScratch> scratch_;
};

}  // namespace
}  // namespace cpu

namespace {

// kernel_isa and kernel_head_dim answer for a resolved instruction set: Auto depends on the defaults and the machine.
void check_resolved(Isa isa, const char* what) {
  STSA_CHECK(isa == Isa::Scalar || isa == Isa::Avx2 || isa == Isa::Avx512 || isa == Isa::Amx, InvalidArgument, what,
             ": the instruction set must be resolved (resolve_isa), got ",
             isa == Isa::Auto ? std::string("auto") : std::to_string(int(isa)));
}

}  // namespace

Isa kernel_isa(Isa isa, const AttentionCall& call) {
  check_resolved(isa, "kernel_isa");
  return cpu::choose_kernel(isa, call).isa;
}

std::int64_t kernel_head_dim(Isa isa, const AttentionCall& call) {
  check_resolved(isa, "kernel_head_dim");
  return cpu::choose_kernel(isa, call).kernel.dim;
}

ProductUnits kernel_product_units(Isa isa, const AttentionCall& call) {
  check_resolved(isa, "kernel_product_units");
  const Isa kernel = cpu::choose_kernel(isa, call).isa;
  if (kernel == Isa::Amx) return ProductUnits::AmxTiles;
  return cpu::pair_paths(isa, false, call, call.o.dtype).pv_avx512 ? ProductUnits::Bf16Dot : ProductUnits::Fma;
}

std::string_view to_string(ProductUnits units) {
  switch (units) {
    case ProductUnits::Fma: return "fma";
    case ProductUnits::Bf16Dot: return "bf16_dot";
    case ProductUnits::AmxTiles: return "amx";
  }
  return "?";
}

std::unique_ptr<Backend> make_cpu_backend(CpuOptions options) {
  STSA_CHECK(options.threads >= 0 && options.threads <= 4096, InvalidArgument,
             "cpu backend: threads must be in [0, 4096] (0: all), got ", options.threads);
  return std::make_unique<cpu::CpuBackend>(options);
}

}  // namespace stsa
