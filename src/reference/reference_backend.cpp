// fp64 reference: two passes over the keys for a block of rows of one head, mask from the spec per pair.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "stsa/error.hpp"
#include "stsa/reference.hpp"

namespace stsa {
namespace {

// Channels of row (b, n, h) as doubles (every input type converts exactly); the
// type switch runs once per row, not once per channel.
void load_row(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, double* out) {
  const std::int64_t dim = t.head_dim(), step = t.stride[3], base = t.offset(b, n, h, 0);
  switch (t.dtype) {
    case DType::F32: {
      const float* p = static_cast<const float*>(t.data) + base;
      for (std::int64_t d = 0; d < dim; ++d) out[d] = p[d * step];
      return;
    }
    case DType::BF16: {
      const auto* halves = static_cast<const std::uint16_t*>(t.data) + base;
      for (std::int64_t d = 0; d < dim; ++d) out[d] = bf16_to_float(halves[d * step]);
      return;
    }
    case DType::F16: {
      const auto* halves = static_cast<const std::uint16_t*>(t.data) + base;
      for (std::int64_t d = 0; d < dim; ++d) out[d] = f16_to_float(halves[d * step]);
      return;
    }
    case DType::F8E4M3: {
      const auto* bytes = static_cast<const std::uint8_t*>(t.data) + base;
      for (std::int64_t d = 0; d < dim; ++d) out[d] = f8e4m3_to_float(bytes[d * step]);
      return;
    }
  }
}

// Four partial sums, so that the dot product is not one serial chain of additions.
double dot(const double* a, const double* b, std::int64_t count) {
  double partial[4] = {0, 0, 0, 0};
  std::int64_t d = 0;
  for (; d + 4 <= count; d += 4)
    for (int lane = 0; lane < 4; ++lane) partial[lane] += a[d + lane] * b[d + lane];
  for (; d < count; ++d) partial[0] += a[d] * b[d];
  return (partial[0] + partial[1]) + (partial[2] + partial[3]);
}

// Rows of one head, a block at a time: each key's k and v are read once per
// block and serve all of its rows (read row by row, a head's keys are strided
// loads that dominated the time). Per row the arithmetic is that of one row
// alone: scores, then the maximum, then exp and sums in key order.
class HeadEvaluator {
 public:
  static constexpr std::size_t kBlockRows = 16;

  HeadEvaluator(const AttentionCall& call, std::int64_t head, const PairPredicate& override_mask)
      : call_(call), head_(head), kv_head_(grouped_kv_head(head, call.q, call.k)), override_(override_mask), spec_(call.heads[std::size_t(head)].spec),
        order_(call.heads[std::size_t(head)].order), dim_(call.layout.head_dim), tokens_(call.layout.tokens()) {
    coords_.reserve(std::size_t(tokens_));
    for (std::int64_t pos = 0; pos < tokens_; ++pos) coords_.push_back(call.layout.grid.coord(pos, order_));
    scores_.resize(kBlockRows * std::size_t(tokens_));
    keep_.resize(kBlockRows * std::size_t(tokens_));
    queries_.resize(kBlockRows * std::size_t(dim_));
    key_row_.resize(std::size_t(dim_));
  }

  // For rows[r] (at most kBlockRows) of batch b: D values of O at out + r * D, the LSE at lse[r].
  void evaluate(std::int64_t b, std::span<const std::int64_t> rows, double* out, double* lse) {
    const std::size_t count = rows.size(), n = std::size_t(tokens_), dim = std::size_t(dim_);
    const double scale = call_.score_scale(b, head_);
    const double out_scale = call_.descales.out(b, head_, call_.layout.heads);
    double max_score[kBlockRows], sum[kBlockRows];
    bool nan[kBlockRows];
    for (std::size_t r = 0; r < count; ++r) {
      load_row(call_.q, b, rows[r], head_, queries_.data() + r * dim);
      max_score[r] = -std::numeric_limits<double>::infinity();
      sum[r] = 0;
      nan[r] = false;
    }
    for (std::size_t j = 0; j < n; ++j) {
      bool loaded = false;
      for (std::size_t r = 0; r < count; ++r) {
        const bool keep = allows(rows[r], std::int64_t(j));
        keep_[r * n + j] = keep;
        if (!keep) continue;
        if (!loaded) load_row(call_.k, b, std::int64_t(j), kv_head_, key_row_.data());
        loaded = true;
        const double s = dot(queries_.data() + r * dim, key_row_.data(), dim_) * scale;
        scores_[r * n + j] = s;
        if (std::isnan(s)) nan[r] = true; else if (s > max_score[r]) max_score[r] = s;
      }
    }
    std::fill_n(out, count * dim, 0.0);
    for (std::size_t j = 0; j < n; ++j) {
      bool loaded = false;
      for (std::size_t r = 0; r < count; ++r) {
        if (!keep_[r * n + j] || nan[r] || max_score[r] == -std::numeric_limits<double>::infinity()) continue;
        if (!loaded) load_row(call_.v, b, std::int64_t(j), kv_head_, key_row_.data());
        loaded = true;
        const double p = std::exp(scores_[r * n + j] - max_score[r]);
        sum[r] += p;
        double* o = out + r * dim;
        for (std::size_t d = 0; d < dim; ++d) o[d] += p * key_row_[d];
      }
    }
    for (std::size_t r = 0; r < count; ++r) {
      double* o = out + r * dim;
      if (nan[r]) {
        std::fill_n(o, dim, std::numeric_limits<double>::quiet_NaN());
        lse[r] = std::numeric_limits<double>::quiet_NaN();
      } else if (max_score[r] == -std::numeric_limits<double>::infinity()) {
        // No allowed key, or only keys scoring -inf: the sum of exp(score) is 0, its log -inf, O stays 0.
        lse[r] = -std::numeric_limits<double>::infinity();
      } else {
        for (std::size_t d = 0; d < dim; ++d) o[d] = o[d] / sum[r] * out_scale;
        lse[r] = max_score[r] + std::log(sum[r]);
      }
    }
  }

 private:
  bool allows(std::int64_t i, std::int64_t j) const {
    return override_ ? override_(head_, i, j)
                     : allowed(call_.layout.grid, spec_, coords_[std::size_t(i)], coords_[std::size_t(j)]);
  }

  const AttentionCall& call_;
  std::int64_t head_;
  std::int64_t kv_head_;  // the K/V head query head head_ reads (grouped-query attention)
  const PairPredicate& override_;
  MaskSpec spec_;
  TokenOrder order_;
  std::int64_t dim_, tokens_;
  std::vector<TokenCoord> coords_;
  std::vector<double> scores_;          // [block row][key]
  std::vector<unsigned char> keep_;     // [block row][key]: whether the key is allowed
  std::vector<double> queries_;         // [block row][D]
  std::vector<double> key_row_;         // the current key's k, then its v
};

// Runs `evaluator` over `rows` of batch b in blocks; out is [rows][D], lse [rows].
void evaluate_rows(HeadEvaluator& evaluator, std::int64_t b, std::span<const std::int64_t> rows, std::int64_t dim,
                   std::vector<double>& out, std::vector<double>& lse) {
  out.resize(rows.size() * std::size_t(dim));
  lse.resize(rows.size());
  for (std::size_t first = 0; first < rows.size(); first += HeadEvaluator::kBlockRows) {
    const std::size_t count = std::min(HeadEvaluator::kBlockRows, rows.size() - first);
    evaluator.evaluate(b, rows.subspan(first, count), out.data() + first * std::size_t(dim), lse.data() + first);
  }
}

class ReferenceBackend final : public Backend {
 public:
  std::string_view name() const override { return "reference"; }
  Support supports(const AttentionCall&) const override { return {}; }

  void run(const AttentionCall& call) const override {
    validate(call, /*require_plans=*/false);
    const PairPredicate none;
    const std::int64_t tokens = call.layout.tokens(), dim = call.layout.head_dim;
    const auto block = std::int64_t(HeadEvaluator::kBlockRows);
    std::vector<std::int64_t> rows;
    std::vector<double> o(std::size_t(block * dim)), lse(HeadEvaluator::kBlockRows);
    for (std::int64_t h = 0; h < call.layout.heads; ++h) {
      if (!call.heads[std::size_t(h)].compute) continue;
      HeadEvaluator evaluator(call, h, none);
      for (std::int64_t b = 0; b < call.layout.batch; ++b)
        for (std::int64_t first = 0; first < tokens; first += block) {
          rows.clear();
          for (std::int64_t i = first; i < std::min(tokens, first + block); ++i) rows.push_back(i);
          evaluator.evaluate(b, rows, o.data(), lse.data());
          for (std::size_t r = 0; r < rows.size(); ++r) {
            for (std::int64_t d = 0; d < dim; ++d) call.o.store(b, rows[r], h, d, float(o[r * std::size_t(dim) + std::size_t(d)]));
            if (call.lse.data) call.lse.at(b, h, rows[r]) = float(lse[r]);
          }
        }
    }
  }
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend() { return std::make_unique<ReferenceBackend>(); }

void reference_rows(const AttentionCall& call, const std::vector<std::int64_t>& rows, std::vector<double>& o,
                    std::vector<double>& lse, const PairPredicate& override_mask) {
  validate(call, /*require_plans=*/false);
  const auto& layout = call.layout;
  for (std::int64_t r : rows)
    STSA_CHECK(r >= 0 && r < layout.tokens(), InvalidArgument, "row ", r, " out of range [0, ", layout.tokens(), ")");
  const auto count = std::int64_t(rows.size());
  o.assign(std::size_t(layout.batch * count * layout.heads * layout.head_dim), 0.0);
  lse.assign(std::size_t(layout.batch * layout.heads * count), 0.0);
  std::vector<double> head_o, head_lse;
  for (std::int64_t h = 0; h < layout.heads; ++h) {
    if (!call.heads[std::size_t(h)].compute) continue;
    HeadEvaluator evaluator(call, h, override_mask);
    for (std::int64_t b = 0; b < layout.batch; ++b) {
      evaluate_rows(evaluator, b, rows, layout.head_dim, head_o, head_lse);
      for (std::int64_t r = 0; r < count; ++r) {
        std::copy_n(head_o.begin() + r * layout.head_dim, layout.head_dim,
                    o.begin() + ((b * count + r) * layout.heads + h) * layout.head_dim);
        lse[std::size_t((b * layout.heads + h) * count + r)] = head_lse[std::size_t(r)];
      }
    }
  }
}

}  // namespace stsa
