// The attention call and the backend interface.
//
//   O[b, i, h, :] = sum_j softmax_j(scale * q_i . k_j over allowed j) v_j
//   LSE[b, h, i]  = log sum_{allowed j} exp(scale * q_i . k_j)      (natural log)
// A query row with no allowed key gets O = 0 and LSE = -inf, and so does a row
// whose allowed keys all score -inf (the sum of exp(score) is then exactly 0).
// Non-finite inputs propagate through the scores of the rows that touch them:
// a NaN score (a NaN in q or k, or inf x 0) or a +inf score makes the row's O
// and LSE NaN; a -inf score gives its key weight 0; a NaN or Inf in an allowed
// key's v makes the row's O non-finite in that channel. Rows that never touch a
// non-finite input are unaffected. Scores are fp32: every backend keeps a row
// finite while its scale * q . k are, up to FLT_MAX (weights come from score
// minus max, never from a product of a score that could pass FLT_MAX first).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "stsa/layout.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"
#include "stsa/tensor.hpp"

namespace stsa {

struct HeadMask {
  MaskSpec spec;                          // what the head attends to (source of truth)
  TokenOrder order = TokenOrder::FrameMajor;  // order of this head's tokens in the tensors
  std::shared_ptr<const TilePlan> plan;   // needed by tiled backends; must match grid, spec and order
  bool compute = true;                    // false: the head is skipped, its O and LSE left untouched
};

// Per-(batch, head) dequantization factors, FlashAttention-3's q_descale, k_descale
// and v_descale: Q, K and V hold a head's values divided by its factor (FP8 quantized
// per head), and the call computes with the values themselves:
//   O[b, i, h, :] = v[b, h] * sum_j softmax_j(scale * q[b, h] * k[b, h] * q_i . k_j) v_j
//   LSE[b, h, i]  = log sum_j exp(scale * q[b, h] * k[b, h] * q_i . k_j)
// Each is empty (every factor 1) or B x H floats, (b, h) at b * H + h, finite and
// > 0 (validate()). Any input dtype; the CPU and reference backends take them.
// validate() also refuses a call where |scale * q[b, h] * k[b, h]| * log2(e), which
// the kernels keep in fp32, is not a finite fp32 for some (b, h).
// The CPU's AVX-512 and AMX kernels compute bf16 Q K^T from bf16 products, which flush
// those below 2^-126 (and bf16 subnormal inputs) to zero; a bf16 head whose scale times
// its q and k descales reaches 2^91 in some batch entry, where such products could
// matter (Q and K scaled down by ~2^-60 with descales of 2^60), has its Q K^T computed in
// fp32 instead. The choice is each head's own, so its bits never depend on the heads
// beside it (the router decides per head too).
struct Descales {
  std::span<const float> q, k, v;

  bool empty() const { return q.empty() && k.empty() && v.empty(); }
  // q[b, h] * k[b, h] and v[b, h] for a call of `heads` heads (1 where empty).
  double score(std::int64_t b, std::int64_t h, std::int64_t heads) const;
  double out(std::int64_t b, std::int64_t h, std::int64_t heads) const;
  // The factors of heads `map` (each in [0, heads)) of every batch entry, in that
  // order, into `storage` (3 x B x map.size() floats): a call on those heads alone.
  Descales for_heads(std::span<const std::int64_t> map, std::int64_t batch, std::int64_t heads,
                     std::vector<float>& storage) const;
};

// Grouped-query attention: k and v may hold fewer heads than q, Hkv dividing H;
// query head h then reads K/V head h / (H / Hkv), as torch's enable_gqa and
// repeat_interleave do, with no copy of K or V.
inline std::int64_t grouped_kv_head(std::int64_t h, std::int64_t query_heads, std::int64_t kv_heads) {
  return kv_heads > 0 && query_heads > kv_heads ? h / (query_heads / kv_heads) : h;
}
// The K/V head that head h of q reads from k (and v).
inline std::int64_t grouped_kv_head(std::int64_t h, const TensorView& q, const TensorView& k) {
  return grouped_kv_head(h, q.heads(), k.heads());
}

struct AttentionCall {
  VideoLayout layout;
  TensorView q;        // logical [B, N, H, D]
  TensorView k, v;     // logical [B, N, Hkv, D], Hkv dividing H (Hkv = H without grouping)
  TensorView o;        // logical [B, N, H, D]; F32, BF16 or F16
  LseView lse;         // logical [B, H, N]; optional (data == nullptr)
  std::vector<HeadMask> heads;  // one per head
  float softmax_scale = 0.f;    // 0 means 1 / sqrt(D)
  Descales descales = {};       // none by default

  float scale() const;
  // What multiplies q_i . k_j in (b, h)'s scores: scale() * q and k descales.
  double score_scale(std::int64_t b, std::int64_t h) const;
};

// Descales' checks, for a call of `batch` x `heads` (the first failure, named, as
// InvalidArgument): sizes, finite and positive values.
void validate_descales(const Descales& descales, std::int64_t batch, std::int64_t heads);

// Checks everything a backend relies on: layout, shapes and strides against the
// layout, dtypes (DType values), the scale and descales, that o/lse do not overlap
// q/k/v or each other, one mask per head, the computed heads' token orders, and
// (when require_plans) that every computed head has a matching plan.
void validate(const AttentionCall& call, bool require_plans);

// The tensor parts of validate(): the layout itself, then one logical
// [B, N, H, D] view or [B, H, N] LSE view against it (shape, non-negative
// strides under which no two elements share an address, and for tensors the
// element alignment); InvalidArgument naming `name` otherwise.
void validate_tensor(const char* name, const TensorView& t, const VideoLayout& layout);
void validate_lse(const char* name, const LseView& lse, const VideoLayout& layout);
// Grouped-query attention's rule: k and v hold one head count that divides q's
// `heads`; InvalidArgument (its message starting with `prefix`) otherwise.
void check_kv_head_counts(std::string_view prefix, std::int64_t k_heads, std::int64_t v_heads, std::int64_t heads);
// K and V against the layout: check_kv_head_counts(), then validate_tensor() of each
// with their heads; messages name the tensors `prefix`k and `prefix`v.
void validate_kv_tensors(const char* prefix, const TensorView& k, const TensorView& v, const VideoLayout& layout);
// Their memory parts alone, for a view of any shape (a sequence shard's, a text
// slice's): strides within the address space, non-negative, under which no two
// elements share an address, and a pointer aligned to the element.
void validate_view_memory(const char* name, const TensorView& t);
void validate_lse_memory(const char* name, const LseView& lse);

// The bytes a span of floats covers (empty: {nullptr, nullptr}), for NamedExtent.
std::pair<const std::byte*, const std::byte*> span_extent(std::span<const float> values);

// A view's name and the bytes it spans (its byte_extent()); made by of(), also the
// view's shape and strides, so that two views whose byte ranges interleave can be
// told apart when they are disjoint slices of one view (the video and text tokens
// of one [B, N, H, D] tensor with B > 1, or with heads outside tokens).
struct NamedExtent {
  std::string_view name;
  std::pair<const std::byte*, const std::byte*> bytes;
  std::size_t element_bytes = 0;  // 0: the bytes alone are known
  std::array<std::int64_t, 4> shape{1, 1, 1, 1}, stride{0, 0, 0, 0};
  static NamedExtent of(std::string_view name, const TensorView& t);
  static NamedExtent of(std::string_view name, const LseView& lse);
};
// validate()'s aliasing rule, for any set of views: no output shares a byte with an
// input ("<what><output> overlaps an input tensor (<input>)") or with an earlier
// output ("<what><output> overlaps <earlier>"); InvalidArgument otherwise. Empty
// extents (null or empty views) overlap nothing; inputs may share bytes. Two views
// whose byte ranges overlap are still apart when both come with their shapes, have
// one element size and the same strides, and are disjoint ranges of one dimension
// of a view under whose strides no two elements share an address (exact for slices
// of one tensor; any other interleaving is refused as overlapping).
void check_outputs_apart(std::string_view what, std::span<const NamedExtent> outputs,
                         std::span<const NamedExtent> inputs);

// Builds HeadMasks for all heads with the given spec and tensor order (plans from `cache`).
std::vector<HeadMask> uniform_heads(const VideoLayout& layout, const MaskSpec& spec, PlanCache& cache,
                                    TileShape tile = {}, Alignment alignment = Alignment::Exact);

// Where a call's O and LSE go when the scatter of routed attention's temporal
// heads is part of the attention's stores (Backend::run_scattered): the call's
// head j (tokens in `from` order) goes to head heads[j] of `o` and `lse` (the
// full [B, N, H, D] and [B, H, N] tensors, tokens in `to` order), as
// scatter_heads (permute.hpp) would move it. No packed output, no second pass.
// A head the call skips (compute = false) leaves its target head untouched,
// where scattering a packed output would copy whatever that output held.
struct ScatteredOutput {
  VideoGrid grid;
  TokenOrder from = TokenOrder::SpatialMajor;
  TokenOrder to = TokenOrder::FrameMajor;
  std::span<const std::int64_t> heads;  // one per head of the call: distinct, in [0, o.heads())
  TensorView o;
  LseView lse;  // data == nullptr: no LSE
};

// The checks of a scattered call that no backend can leave out: call.o and
// call.lse empty, the grid and the orders, the head map, the full tensors
// (shapes, strides under which no two elements of any head share an address),
// no overlap with the inputs (descales included) or each other. Returns the call
// with out.o and out.lse narrowed to its head count in the roles of o and lse, for
// validate() and supports() (what the narrowing hides is what is checked here).
AttentionCall scattered_call_for_checks(const AttentionCall& call, const ScatteredOutput& out);

// Where a call's Q, K and V come from when the gather of routed attention's
// temporal heads is part of the attention's loads (Backend::run_gathered): the
// call's head j reads head heads[j] of q, k and v (the full [B, N, H, D] tensors,
// tokens in `from` order) with its tokens in `to` order, as gather_heads
// (permute.hpp) would pack them. No packed copies, no gather pass.
struct GatheredInput {
  VideoGrid grid;
  TokenOrder from = TokenOrder::FrameMajor;
  TokenOrder to = TokenOrder::SpatialMajor;
  std::span<const std::int64_t> heads;  // one per head of the call: distinct, in [0, q.heads())
  TensorView q, k, v;                   // k and v: q's heads or fewer (grouped, as in AttentionCall)
};

// The checks of a gathered call (on top of scattered_call_for_checks(), which
// it runs with the full inputs): call.q, call.k and call.v empty, the grid and
// the orders (the call's heads in `in.to` order), the head map (each input
// head once), the full inputs (shapes, dtypes, strides; k and v may hold fewer
// heads than q, grouped as in AttentionCall, and head j then reads K/V head
// grouped_kv_head(heads[j], q, k)). Returns the call with in.q narrowed to its head count
// in the role of q, in.k and in.v to one head in those of k and v (grouped: the
// map, not the narrowed view, says which K/V head each head reads), and out.o
// and out.lse in those of o and lse, for validate() and supports().
AttentionCall gathered_call_for_checks(const AttentionCall& call, const GatheredInput& in,
                                       const ScatteredOutput& out);

struct Support {
  bool ok = true;
  std::string why;  // set when !ok
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Support supports(const AttentionCall& call) const = 0;
  // Validates, then computes. Throws Unsupported when supports() says no.
  virtual void run(const AttentionCall& call) const = 0;
  // Whether run_scattered() computes here (else it throws Unsupported).
  virtual bool runs_scattered() const { return false; }
  // run() with O and LSE stored where `out` says; call.o and call.lse must be
  // empty. Checked as run() checks a call, plus scattered_call_for_checks().
  virtual void run_scattered(const AttentionCall& call, const ScatteredOutput& out) const;
  // Whether run_gathered() computes here (else it throws Unsupported).
  virtual bool runs_gathered() const { return false; }
  // run_scattered() with Q, K and V read where `in` says; call.q, call.k and
  // call.v must be empty. Checked as run() checks a call, plus
  // gathered_call_for_checks().
  virtual void run_gathered(const AttentionCall& call, const GatheredInput& in, const ScatteredOutput& out) const;
};

// Registered backends: "reference", "cpu", and "cuda" when built with it.
std::vector<const Backend*> backends();
const Backend& backend(std::string_view name);  // throws InvalidArgument for an unknown name

}  // namespace stsa
