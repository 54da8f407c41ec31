#include "support/testing.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>

#include "stsa/error.hpp"
#include "stsa/mask.hpp"
#include "support/float_limit.hpp"

namespace stsa::testing {
namespace {

constexpr std::byte kSentinel{0xA5};
constexpr float kLseSentinel = -12345.678f;

std::uint16_t nan_bits(DType t) { return t == DType::BF16 ? 0x7fc0 : 0x7e00; }

// One (batch, head)'s K and V as floats, [token][dim]: converted once, not at every
// score of every row (the comparisons' largest cost, ~80% under ASan, was these loads).
// Also the largest |k_j| (2-norm) and |v| of the head, for the scores' rounding bound:
// over finite ones only, so that an infinity planted in one key does not make every
// other row's bound infinite (rows that see it are held to the infinity rules).
struct HeadKeysValues {
  std::vector<float> k, v;
  double max_key_norm = 0, max_abs_value = 0;
  HeadKeysValues(const AttentionCall& call, std::int64_t b, std::int64_t h) {
    const std::int64_t n = call.layout.tokens(), dims = call.layout.head_dim;
    const std::int64_t kv_head = h / (call.layout.heads / call.k.heads());  // grouped K/V: by its definition
    k.resize(std::size_t(n * dims));
    v.resize(std::size_t(n * dims));
    for (std::int64_t j = 0; j < n; ++j) {
      double key_norm2 = 0;
      for (std::int64_t d = 0; d < dims; ++d) {
        k[std::size_t(j * dims + d)] = call.k.load(b, j, kv_head, d);
        v[std::size_t(j * dims + d)] = call.v.load(b, j, kv_head, d);
        key_norm2 += double(k[std::size_t(j * dims + d)]) * k[std::size_t(j * dims + d)];
        const double value = std::abs(double(v[std::size_t(j * dims + d)]));
        if (std::isfinite(value)) max_abs_value = std::max(max_abs_value, value);
      }
      if (std::isfinite(key_norm2)) max_key_norm = std::max(max_key_norm, std::sqrt(key_norm2));
    }
  }
};

// How far fp32 rounding of row i's scores can move its logits: a sum of D products
// is off by about u * sum_d |q_d k_d| <= u * |q| |k| (Cauchy-Schwarz), whatever the
// order of the sum. The floor below does not grow with the logits; this does.
double score_rounding(const AttentionCall& call, const HeadKeysValues& kv, std::int64_t b, std::int64_t h,
                      std::int64_t i) {
  double query_norm2 = 0;
  for (std::int64_t d = 0; d < call.layout.head_dim; ++d) {
    const double x = call.q.load(b, i, h, d);
    query_norm2 += x * x;
  }
  return 0x1p-24 * std::abs(call.score_scale(b, h)) * std::sqrt(query_norm2) * kv.max_key_norm;
}

// What a straightforward same-precision implementation computes: fp32 scores,
// max, exp and sums over the allowed keys, output rounded to o's dtype.
void naive_row(const AttentionCall& call, const HeadKeysValues& kv, std::int64_t b, std::int64_t h, std::int64_t i,
               const PairPredicate& keep, std::vector<float>& scores, float* out, float& lse) {
  const std::int64_t n = call.layout.tokens(), dims = call.layout.head_dim;
  const auto scale = float(call.score_scale(b, h));
  const auto out_scale = float(call.descales.out(b, h, call.layout.heads));
  std::vector<float> q(static_cast<std::size_t>(dims));
  for (std::int64_t d = 0; d < dims; ++d) q[std::size_t(d)] = call.q.load(b, i, h, d);
  float max_score = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < n; ++j) {
    if (!keep(h, i, j)) {
      scores[std::size_t(j)] = -std::numeric_limits<float>::infinity();
      continue;
    }
    const float* k = kv.k.data() + j * dims;
    float dot = 0;
    for (std::int64_t d = 0; d < dims; ++d) dot += q[std::size_t(d)] * k[d];
    scores[std::size_t(j)] = dot * scale;
    max_score = std::max(max_score, scores[std::size_t(j)]);
  }
  std::fill(out, out + dims, 0.f);
  if (max_score == -std::numeric_limits<float>::infinity()) {  // no key, or only keys scoring -inf (attention.hpp)
    lse = -std::numeric_limits<float>::infinity();
    return;
  }
  float sum = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    if (scores[std::size_t(j)] == -std::numeric_limits<float>::infinity()) continue;
    const float p = std::exp(scores[std::size_t(j)] - max_score);
    sum += p;
    const float* v = kv.v.data() + j * dims;
    for (std::int64_t d = 0; d < dims; ++d) out[d] += p * v[d];
  }
  for (std::int64_t d = 0; d < dims; ++d) {
    float x = out[d] / sum * out_scale;
    if (call.o.dtype == DType::BF16) x = bf16_to_float(float_to_bf16(x));
    if (call.o.dtype == DType::F16) x = f16_to_float(float_to_f16(x));
    out[d] = x;
  }
  lse = max_score + std::log(sum);
}

}  // namespace

std::uint64_t fresh_seed() {
  if (const char* fixed = std::getenv("STSA_TEST_SEED")) return std::strtoull(fixed, nullptr, 10);
  std::random_device device;
  return (std::uint64_t(device()) << 32) ^ device();
}

void fill_normal(const TensorView& t, std::uint64_t seed, float stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, stddev);
  for (std::int64_t b = 0; b < t.shape[0]; ++b)
    for (std::int64_t n = 0; n < t.shape[1]; ++n)
      for (std::int64_t h = 0; h < t.shape[2]; ++h)
        for (std::int64_t d = 0; d < t.shape[3]; ++d) t.store(b, n, h, d, normal(rng));
}

GuardedTensor::GuardedTensor(DType dtype, std::int64_t batch, std::int64_t tokens, std::int64_t heads,
                             std::int64_t head_dim, MemoryLayout layout) {
  payload_bytes_ = std::size_t(batch * tokens * heads * head_dim) * element_size(dtype);
  storage_.assign(payload_bytes_ + 2 * kGuardBytes, kSentinel);
  shape_ = TensorView::contiguous(nullptr, dtype, batch, tokens, heads, head_dim, layout);
  poison();
}

void GuardedTensor::poison() {
  std::byte* payload = storage_.data() + kGuardBytes;
  if (shape_.dtype == DType::F32) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (std::size_t i = 0; i < payload_bytes_; i += 4) std::memcpy(payload + i, &nan, 4);
  } else if (shape_.dtype == DType::F8E4M3) {
    std::memset(payload, 0x7f, payload_bytes_);  // E4M3FN's NaN
  } else {
    const std::uint16_t nan = nan_bits(shape_.dtype);
    for (std::size_t i = 0; i < payload_bytes_; i += 2) std::memcpy(payload + i, &nan, 2);
  }
}

void GuardedTensor::poison_finite() {
  const TensorView t = view();
  for (std::int64_t b = 0; b < t.shape[0]; ++b)
    for (std::int64_t n = 0; n < t.shape[1]; ++n)
      for (std::int64_t h = 0; h < t.shape[2]; ++h)
        for (std::int64_t d = 0; d < t.shape[3]; ++d) t.store(b, n, h, d, kFinitePoison);
}

bool GuardedTensor::guards_intact() const {
  for (std::size_t i = 0; i < kGuardBytes; ++i)
    if (storage_[i] != kSentinel || storage_[kGuardBytes + payload_bytes_ + i] != kSentinel) return false;
  return true;
}

GuardedLse::GuardedLse(std::int64_t batch, std::int64_t heads, std::int64_t tokens) {
  storage_.assign(std::size_t(batch * heads * tokens + 2 * kGuardFloats), kLseSentinel);
  shape_ = LseView::contiguous(nullptr, batch, heads, tokens);
  poison();
}

void GuardedLse::poison() {
  std::fill(storage_.begin() + kGuardFloats, storage_.end() - kGuardFloats, std::numeric_limits<float>::quiet_NaN());
}

void GuardedLse::poison_finite() {
  std::fill(storage_.begin() + kGuardFloats, storage_.end() - kGuardFloats, kFinitePoison);
}

bool GuardedLse::guards_intact() const {
  for (std::int64_t i = 0; i < kGuardFloats; ++i)
    if (storage_[std::size_t(i)] != kLseSentinel || storage_[storage_.size() - 1 - std::size_t(i)] != kLseSentinel)
      return false;
  return true;
}

AttentionCall first_heads(AttentionCall call, std::int64_t heads) {
  call.layout.heads = heads;
  for (TensorView* t : {&call.q, &call.k, &call.v}) t->shape[2] = heads;
  call.heads.resize(std::size_t(heads));
  return call;
}

AttentionCall Problem::call() const {
  AttentionCall c;
  c.layout = layout;
  c.q = q.view();
  c.k = k.view();
  c.v = v.view();
  c.o = o.view();
  c.lse = lse.view();
  c.heads = heads;
  c.softmax_scale = softmax_scale;
  c.descales = Descales{q_descale, k_descale, v_descale};
  return c;
}

std::vector<float> random_descales(std::int64_t count, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> exponent(-2.f, 2.f);
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& v : values) v = std::exp2(exponent(rng));
  return values;
}

void give_descales(Problem& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (std::vector<float>* factors : {&p.q_descale, &p.k_descale, &p.v_descale})
    *factors = random_descales(p.layout.batch * p.layout.heads, rng);
}

void plant_scores_at_the_float_limit(Problem& p, std::uint64_t seed) {
  if (p.dtype != DType::F32 && p.dtype != DType::BF16)
    throw std::invalid_argument("plant_scores_at_the_float_limit: fp32 or bf16 inputs only");
  std::mt19937_64 rng(seed);
  p.softmax_scale = 1.0f;
  store_float_limit_channels(p.q.view(), p.k.view(), rng);
}

FloatLimitErrors float_limit_errors(const Problem& p) {
  const VideoLayout& layout = p.layout;
  std::vector<std::int64_t> rows;
  for (std::int64_t n = 0; n < layout.tokens(); ++n)
    if (n % 3 != 0) rows.push_back(n);
  const AttentionCall call = p.call();
  std::vector<double> ref_o, ref_lse;
  reference_rows(call, rows, ref_o, ref_lse);
  FloatLimitErrors e;
  e.rows = std::int64_t(rows.size());
  const auto worse = [](double& worst, double err) { worst = std::isnan(err) ? INFINITY : std::max(worst, err); };
  for (std::int64_t b = 0; b < layout.batch; ++b)
    for (std::int64_t r = 0; r < e.rows; ++r)
      for (std::int64_t h = 0; h < layout.heads; ++h) {
        if (!call.heads[std::size_t(h)].compute) continue;
        const std::int64_t n = rows[std::size_t(r)];
        for (std::int64_t d = 0; d < layout.head_dim; ++d) {
          const double want = ref_o[std::size_t(((b * e.rows + r) * layout.heads + h) * layout.head_dim + d)];
          worse(e.o_max_abs, std::abs(double(call.o.load(b, n, h, d)) - want));
        }
        const double want = ref_lse[std::size_t((b * layout.heads + h) * e.rows + r)];
        const double got = call.lse.at(b, h, n);
        worse(e.lse_max_rel, got == want ? 0.0 : std::abs(got - want) / std::abs(want));
      }
  return e;
}

std::vector<HeadMask> mixed_heads(const VideoLayout& layout, double density, PlanCache& plans) {
  const SparseKind kinds[] = {SparseKind::Spatial, SparseKind::Temporal, SparseKind::FrameWindow};
  std::vector<HeadMask> heads;
  for (std::int64_t h = 0; h < layout.heads; ++h) {
    const MaskSpec spec = mask_for_density(layout.grid, kinds[h % 3], density);
    heads.push_back(HeadMask{spec, spec.natural_order(), plans.get(layout.grid, spec, {64, 64}), true});
  }
  return heads;
}

Problem make_problem(const VideoLayout& layout, DType dtype, std::vector<HeadMask> heads, std::uint64_t seed,
                     MemoryLayout memory, DType out_dtype) {
  const std::int64_t n = layout.tokens();
  Problem p{layout,
            dtype,
            memory,
            Tensor(dtype, layout.batch, n, layout.heads, layout.head_dim, memory),
            Tensor(dtype, layout.batch, n, layout.heads, layout.head_dim, memory),
            Tensor(dtype, layout.batch, n, layout.heads, layout.head_dim, memory),
            GuardedTensor(out_dtype, layout.batch, n, layout.heads, layout.head_dim, memory),
            GuardedLse(layout.batch, layout.heads, n),
            std::move(heads),
            {}};
  fill_normal(p.q.view(), seed * 3 + 1);
  fill_normal(p.k.view(), seed * 3 + 2);
  fill_normal(p.v.view(), seed * 3 + 3);
  std::ostringstream label;
  label << "grid " << layout.grid.describe() << " B=" << layout.batch << " H=" << layout.heads
        << " D=" << layout.head_dim << " " << to_string(dtype) << "->" << to_string(out_dtype)
        << (memory == MemoryLayout::BNHD ? " BNHD" : " BHND") << " seed=" << seed << " masks:";
  for (const auto& h : p.heads) {
    label << " [" << h.spec.describe() << ", " << to_string(h.order);
    if (h.plan) label << ", tile " << h.plan->tile().q << "x" << h.plan->tile().k << " " << to_string(h.plan->alignment());
    label << "]";
  }
  p.label = label.str();
  return p;
}

Comparison compare_with_reference(const Problem& problem, int sample_rows, std::uint64_t seed,
                                  const PairPredicate& override_mask) {
  const AttentionCall call = problem.call();
  const auto& layout = call.layout;
  const std::int64_t n = layout.tokens(), dims = layout.head_dim;
  std::vector<std::int64_t> rows;
  if (sample_rows <= 0 || sample_rows >= n) {
    for (std::int64_t i = 0; i < n; ++i) rows.push_back(i);
  } else {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<std::int64_t> pick(0, n - 1);
    for (int i = 0; i < sample_rows; ++i) rows.push_back(pick(rng));
  }
  Comparison c;
  std::vector<double>& ref_o = c.reference.o;
  std::vector<double>& ref_lse = c.reference.lse;
  reference_rows(call, rows, ref_o, ref_lse, override_mask);

  PairPredicate keep = override_mask;
  std::vector<std::vector<TokenCoord>> coords(std::size_t(layout.heads));
  if (!keep) {
    for (std::int64_t h = 0; h < layout.heads; ++h)
      for (std::int64_t pos = 0; pos < n; ++pos)
        coords[std::size_t(h)].push_back(layout.grid.coord(pos, call.heads[std::size_t(h)].order));
    keep = [&](std::int64_t h, std::int64_t i, std::int64_t j) {
      return allowed(layout.grid, call.heads[std::size_t(h)].spec, coords[std::size_t(h)][std::size_t(i)],
                     coords[std::size_t(h)][std::size_t(j)]);
    };
  }

  c.guards_intact = problem.o.guards_intact() && problem.lse.guards_intact();
  double err2 = 0, ref2 = 0, max_ref = 0, max_lse = 0, logit_rounding = 0, output_rounding = 0;
  std::vector<float> scores(static_cast<std::size_t>(n)), naive(static_cast<std::size_t>(dims));
  const auto count = std::int64_t(rows.size());
  std::ostringstream why;
  for (std::int64_t h = 0; h < layout.heads; ++h) {
    if (!call.heads[std::size_t(h)].compute) continue;
    for (std::int64_t b = 0; b < layout.batch; ++b) {
      const HeadKeysValues kv(call, b, h);
      for (std::int64_t r = 0; r < count; ++r) {
        const std::int64_t i = rows[std::size_t(r)];
        const double* ref = ref_o.data() + std::size_t(((b * count + r) * layout.heads + h) * dims);
        const double ref_l = ref_lse[std::size_t((b * layout.heads + h) * count + r)];
        float naive_lse = 0;
        naive_row(call, kv, b, h, i, keep, scores, naive.data(), naive_lse);
        // (An infinite q makes this row's scores infinite or NaN: held to the rules, not a bound.)
        const double row_rounding = score_rounding(call, kv, b, h, i);
        const double row_logit_rounding = std::isfinite(row_rounding) ? row_rounding : 0.0;
        logit_rounding = std::max(logit_rounding, row_logit_rounding);
        // A logit off by e moves O by at most e * max |v_j - O| <= 2 e max |v|.
        output_rounding = std::max(output_rounding, 2 * row_logit_rounding * kv.max_abs_value *
                                                        std::abs(call.descales.out(b, h, layout.heads)));
        for (std::int64_t d = 0; d < dims; ++d) {
          const double got = call.o.load(b, i, h, d);
          if (std::isnan(ref[d]) != std::isnan(got)) {
            c.all_finite_where_expected = false;
            if (why.str().empty()) why << "O[b=" << b << ", i=" << i << ", h=" << h << ", d=" << d << "] = " << got
                                       << ", reference " << ref[d];
            continue;
          }
          if (std::isnan(ref[d])) continue;
          // An infinity matched exactly is no error (Inf - Inf would be NaN); any other
          // infinity in either is an infinite one. Neither is NaN here, so e is not.
          const double e = got == ref[d] ? 0.0 : std::abs(got - ref[d]);
          c.max_abs_err = std::max(c.max_abs_err, e);
          if (!std::isfinite(ref[d])) continue;  // the bound's terms: finite values only
          const double naive_err = std::abs(double(naive[std::size_t(d)]) - ref[d]);
          if (std::isfinite(naive_err)) c.naive_max_abs_err = std::max(c.naive_max_abs_err, naive_err);
          err2 += e * e;
          ref2 += ref[d] * ref[d];
          max_ref = std::max(max_ref, std::abs(ref[d]));
        }
        if (call.lse.data) {
          const double got = call.lse.at(b, h, i);
          if (std::isinf(ref_l) || std::isnan(ref_l)) {
            const bool same = std::isnan(ref_l) ? std::isnan(got) : got == ref_l;
            if (!same) {
              c.all_finite_where_expected = false;
              if (why.str().empty()) why << "LSE[b=" << b << ", h=" << h << ", i=" << i << "] = " << got
                                         << ", reference " << ref_l;
            }
          } else if (std::isnan(got)) {  // unwritten (poisoned) or wrongly NaN: no error size can say so
            c.all_finite_where_expected = false;
            if (why.str().empty()) why << "LSE[b=" << b << ", h=" << h << ", i=" << i << "] = NaN, reference " << ref_l;
          } else {
            c.lse_max_abs_err = std::max(c.lse_max_abs_err, std::abs(got - ref_l));
            const double naive_err = std::abs(double(naive_lse) - ref_l);
            if (std::isfinite(naive_err)) c.naive_lse_max_abs_err = std::max(c.naive_lse_max_abs_err, naive_err);
            max_lse = std::max(max_lse, std::abs(ref_l));
          }
        }
      }
    }
  }
  c.rel_l2_err = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  // Twice what the naive same-precision implementation gets wrong, plus a rounding floor
  // of a few units of the output's (and inputs') precision, plus 16 fp32 units for the
  // kernels' fp32 accumulation in another order than the naive one (blocked sums,
  // online rescaling): with fp32 outputs the naive error alone is itself a random draw,
  // and a kernel at 3x it on one seed in a few hundred is rounding, not a bug (a wrong
  // mask bit or a missed rescale moves O by 1e-3 or more). Plus what the scores'
  // rounding can do to O and LSE (score_rounding), which the rest does not follow as
  // the logits grow: the Python suite's same bound, whose naive rows are NumPy's
  // more accurate blocked sums, failed 2-12% of correct fp32 calls with inputs at
  // 3-4x N(0, 1) without it, none of 4,000 with it.
  const double roundoff = unit_roundoff(call.o.dtype);
  c.tolerance = 2.0 * c.naive_max_abs_err + (4.0 * roundoff + 16.0 * 0x1p-24) * std::max(1.0, max_ref) +
                output_rounding;
  // (LSE moves with the logits one for one: its error measured up to 2.7x their
  // rounding's term, median 1.15x, at inputs of 4x N(0, 1); so 4x it.)
  c.lse_tolerance =
      2.0 * c.naive_lse_max_abs_err + 8.0 * 0x1p-24 * std::max(1.0, max_lse) + 4.0 * logit_rounding;
  if (!c.guards_intact) why << (why.str().empty() ? "" : "; ") << "guard bytes around an output were overwritten";
  if (!(c.max_abs_err <= c.tolerance))
    why << (why.str().empty() ? "" : "; ") << "max |O - ref| = " << c.max_abs_err << " > tolerance " << c.tolerance
        << " (naive same-precision error " << c.naive_max_abs_err << ")";
  if (!(c.lse_max_abs_err <= c.lse_tolerance))
    why << (why.str().empty() ? "" : "; ") << "max |LSE - ref| = " << c.lse_max_abs_err << " > tolerance "
        << c.lse_tolerance << " (naive " << c.naive_lse_max_abs_err << ")";
  c.reference.rows = std::move(rows);
  c.failure = why.str();
  if (!c.failure.empty())
    c.failure = problem.label + ": " + c.failure + "\n" + error_pattern(call, c.reference, c.tolerance, c.lse_tolerance);
  return c;
}

}  // namespace stsa::testing
