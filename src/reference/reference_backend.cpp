// fp64 reference: two passes over the keys of one row, mask from the spec per pair.
#include <cmath>
#include <limits>
#include <vector>

#include "stsa/error.hpp"
#include "stsa/reference.hpp"

namespace stsa {
namespace {

class RowEvaluator {
 public:
  RowEvaluator(const AttentionCall& call, std::int64_t head, const PairPredicate& override_mask)
      : call_(call), head_(head), override_(override_mask), spec_(call.heads[std::size_t(head)].spec),
        order_(call.heads[std::size_t(head)].order) {
    const VideoGrid& grid = call.layout.grid;
    coords_.reserve(std::size_t(grid.tokens()));
    for (std::int64_t pos = 0; pos < grid.tokens(); ++pos) coords_.push_back(grid.coord(pos, order_));
    scores_.resize(std::size_t(grid.tokens()));
    keep_.resize(std::size_t(grid.tokens()));
    query_.resize(std::size_t(call.layout.head_dim));
  }

  // Writes D values of O for row i of batch b into out; returns the row's LSE.
  double evaluate(std::int64_t b, std::int64_t i, double* out) {
    const std::int64_t n = call_.layout.tokens(), d_count = call_.layout.head_dim;
    const double scale = call_.scale();
    for (std::int64_t d = 0; d < d_count; ++d) query_[std::size_t(d)] = call_.q.load(b, i, head_, d);
    double max_score = -std::numeric_limits<double>::infinity();
    bool any = false, nan = false;
    for (std::int64_t j = 0; j < n; ++j) {
      const bool keep = override_ ? override_(head_, i, j)
                                  : allowed(call_.layout.grid, spec_, coords_[std::size_t(i)], coords_[std::size_t(j)]);
      if (!keep) {
        keep_[std::size_t(j)] = 0;
        continue;
      }
      keep_[std::size_t(j)] = 1;
      double dot = 0;
      for (std::int64_t d = 0; d < d_count; ++d) dot += query_[std::size_t(d)] * double(call_.k.load(b, j, head_, d));
      const double s = dot * scale;
      scores_[std::size_t(j)] = s;
      any = true;
      if (std::isnan(s)) nan = true; else if (s > max_score) max_score = s;
    }
    for (std::int64_t d = 0; d < d_count; ++d) out[d] = 0.0;
    if (!any) return -std::numeric_limits<double>::infinity();
    if (nan) {
      for (std::int64_t d = 0; d < d_count; ++d) out[d] = std::numeric_limits<double>::quiet_NaN();
      return std::numeric_limits<double>::quiet_NaN();
    }
    double sum = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      if (!keep_[std::size_t(j)]) continue;
      const double p = std::exp(scores_[std::size_t(j)] - max_score);
      sum += p;
      for (std::int64_t d = 0; d < d_count; ++d) out[d] += p * double(call_.v.load(b, j, head_, d));
    }
    for (std::int64_t d = 0; d < d_count; ++d) out[d] /= sum;
    return max_score + std::log(sum);
  }

 private:
  const AttentionCall& call_;
  std::int64_t head_;
  const PairPredicate& override_;
  MaskSpec spec_;
  TokenOrder order_;
  std::vector<TokenCoord> coords_;
  std::vector<double> scores_;
  std::vector<double> query_;
  std::vector<unsigned char> keep_;  // whether key j is allowed for the current row
};

class ReferenceBackend final : public Backend {
 public:
  std::string_view name() const override { return "reference"; }
  Support supports(const AttentionCall&) const override { return {}; }

  void run(const AttentionCall& call) const override {
    validate(call, /*require_plans=*/false);
    const PairPredicate none;
    std::vector<double> row(std::size_t(call.layout.head_dim));
    for (std::int64_t h = 0; h < call.layout.heads; ++h) {
      if (!call.heads[std::size_t(h)].compute) continue;
      RowEvaluator evaluator(call, h, none);
      for (std::int64_t b = 0; b < call.layout.batch; ++b)
        for (std::int64_t i = 0; i < call.layout.tokens(); ++i) {
          const double lse = evaluator.evaluate(b, i, row.data());
          for (std::int64_t d = 0; d < call.layout.head_dim; ++d) call.o.store(b, i, h, d, float(row[std::size_t(d)]));
          if (call.lse.data) call.lse.at(b, h, i) = float(lse);
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
  for (std::int64_t h = 0; h < layout.heads; ++h) {
    if (!call.heads[std::size_t(h)].compute) continue;
    RowEvaluator evaluator(call, h, override_mask);
    for (std::int64_t b = 0; b < layout.batch; ++b)
      for (std::int64_t r = 0; r < count; ++r) {
        double* out = o.data() + std::size_t(((b * count + r) * layout.heads + h) * layout.head_dim);
        lse[std::size_t((b * layout.heads + h) * count + r)] = evaluator.evaluate(b, rows[std::size_t(r)], out);
      }
  }
}

}  // namespace stsa
