#include "stsa/synth.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "stsa/error.hpp"

namespace stsa::synth {
namespace {

constexpr double kSharpLength = 0.35;  // kernel length (frames or patches) along a head's sharp axes
constexpr int kFieldChannels = 8;
constexpr int kFieldWaves = 4;
constexpr double kValueNoise = 0.3;
// Frame-0 keys keep this share of their rotary match, so the sink spreads over the
// whole frame instead of piling onto the query's own patch in frame 0.
constexpr double kAnchorRotaryShare = 0.3;

// A smooth field of kFieldChannels channels: plane waves of long wavelength drifting with one velocity.
struct MovingField {
  struct Wave {
    double ky, kx, phase, amplitude;
  };
  std::vector<Wave> waves;  // kFieldChannels * kFieldWaves
  double vy = 0, vx = 0;    // patches per frame

  MovingField(const VideoGrid& grid, std::mt19937_64& rng) {
    std::normal_distribution<double> normal;
    std::uniform_real_distribution<double> uniform(0.0, 2 * M_PI);
    const double span = double(std::max(grid.height, grid.width));
    vy = 0.5 * normal(rng);
    vx = 0.5 * normal(rng);
    for (int i = 0; i < kFieldChannels * kFieldWaves; ++i)
      waves.push_back({2 * M_PI * normal(rng) / span, 2 * M_PI * normal(rng) / span, uniform(rng),
                       1.0 / std::sqrt(double(kFieldWaves))});
  }
  void at(double f, double y, double x, double* out) const {
    for (int c = 0; c < kFieldChannels; ++c) {
      double sum = 0;
      for (int w = 0; w < kFieldWaves; ++w) {
        const Wave& wave = waves[std::size_t(c * kFieldWaves + w)];
        sum += wave.amplitude * std::cos(wave.ky * (y - vy * f) + wave.kx * (x - vx * f) + wave.phase);
      }
      out[c] = sum;
    }
  }
};

struct HeadShape {
  Route kind = Route::Spatial;
  std::vector<double> wf, wy, wx, phase;  // per rotary pair
  std::vector<double> mix_qk, mix_v;      // kFieldChannels x head_dim projections of the field
};

HeadShape make_head(Route kind, const Options& o, std::mt19937_64& rng) {
  HeadShape h;
  h.kind = kind;
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform(0.0, 2 * M_PI), jitter(0.7, 1.3);
  const VideoGrid& g = o.grid;
  // Length scales of the Gaussian kernel per axis; the rotary frequencies are drawn with std 1 / length.
  double lf, ly, lx;
  if (kind == Route::Spatial) {
    lf = kSharpLength;
    ly = jitter(rng) * std::max(1.0, double(g.height) / 4);
    lx = jitter(rng) * std::max(1.0, double(g.width) / 4);
  } else {
    lf = jitter(rng) * std::max(1.0, double(g.frames));
    ly = lx = kSharpLength;
  }
  const std::int64_t pairs = o.head_dim / 2;
  for (std::int64_t m = 0; m < pairs; ++m) {
    h.wf.push_back(normal(rng) / lf);
    h.wy.push_back(normal(rng) / ly);
    h.wx.push_back(normal(rng) / lx);
    h.phase.push_back(uniform(rng));
  }
  const double norm = 1.0 / std::sqrt(double(kFieldChannels));
  for (std::int64_t i = 0; i < kFieldChannels * o.head_dim; ++i) {
    h.mix_qk.push_back(norm * normal(rng));
    h.mix_v.push_back(norm * normal(rng));
  }
  return h;
}

}  // namespace

void Options::validate() const {
  grid.validate();
  STSA_CHECK(batch >= 1, InvalidArgument, "synthetic batch must be >= 1, got ", batch);
  STSA_CHECK(heads >= 1, InvalidArgument, "synthetic heads must be >= 1, got ", heads);
  STSA_CHECK(head_dim >= 4 && head_dim <= 512 && head_dim % 2 == 0, InvalidArgument,
             "synthetic head dim must be even and in [4, 512], got ", head_dim);
  STSA_CHECK(std::isfinite(temporal_fraction) && temporal_fraction >= 0 && temporal_fraction <= 1, InvalidArgument,
             "temporal fraction must be in [0, 1], got ", temporal_fraction);
  STSA_CHECK(std::isfinite(peak_logit) && peak_logit >= 0 && peak_logit <= 80, InvalidArgument,
             "peak logit must be in [0, 80], got ", peak_logit);
  STSA_CHECK(std::isfinite(anchor_logit) && anchor_logit >= 0 && anchor_logit <= 40, InvalidArgument,
             "anchor logit must be in [0, 40], got ", anchor_logit);
  STSA_CHECK(std::isfinite(content_weight) && content_weight >= 0 && content_weight <= 1, InvalidArgument,
             "content weight must be in [0, 1], got ", content_weight);
  VideoLayout{grid, batch, heads, head_dim}.validate();
}

Data make_video_tokens(const Options& o) {
  o.validate();
  Data data;
  data.layout = VideoLayout{o.grid, o.batch, o.heads, o.head_dim};
  const std::int64_t n = o.grid.tokens(), d = o.head_dim, pairs = d / 2;
  check_host_allocation(3 * std::uint64_t(o.batch * n * o.heads * d) * element_size(o.dtype), "synthetic Q/K/V");
  data.q = Tensor(o.dtype, o.batch, n, o.heads, d, o.memory);
  data.k = Tensor(o.dtype, o.batch, n, o.heads, d, o.memory);
  data.v = Tensor(o.dtype, o.batch, n, o.heads, d, o.memory);

  std::mt19937_64 rng(o.seed);
  // Which heads are temporal: a seeded choice of round(H * fraction) heads.
  std::vector<std::int64_t> order(std::size_t(o.heads));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const auto temporal = std::int64_t(std::llround(double(o.heads) * o.temporal_fraction));
  data.truth.assign(std::size_t(o.heads), Route::Spatial);
  for (std::int64_t i = 0; i < temporal; ++i) data.truth[std::size_t(order[std::size_t(i)])] = Route::Temporal;

  std::vector<HeadShape> shapes;
  for (std::int64_t h = 0; h < o.heads; ++h) shapes.push_back(make_head(data.truth[std::size_t(h)], o, rng));
  std::vector<MovingField> fields;  // one per batch entry: different "videos"
  for (std::int64_t b = 0; b < o.batch; ++b) fields.emplace_back(o.grid, rng);

  // Pair 0 is the frame-0 sink; the others rotate. q . k of a token with itself is
  // amplitude^2 * (pairs - 1) over the rotary pairs; scaled by 1/sqrt(D) it is peak_logit.
  const double amplitude = std::sqrt(o.peak_logit * std::sqrt(double(d)) / double(pairs - 1));
  const double sink = std::sqrt(o.anchor_logit * std::sqrt(double(d)));
  const double rotary_share = std::sqrt(1.0 - o.content_weight * o.content_weight);
  const TensorView q = data.q.view(), k = data.k.view(), v = data.v.view();
  std::normal_distribution<double> normal;
  std::vector<double> field(kFieldChannels);
  for (std::int64_t b = 0; b < o.batch; ++b) {
    for (std::int64_t pos = 0; pos < n; ++pos) {
      const TokenCoord c = o.grid.coord(pos, TokenOrder::FrameMajor);
      if (c.is_text) {
        for (std::int64_t h = 0; h < o.heads; ++h)
          for (std::int64_t i = 0; i < d; ++i) {
            q.store(b, pos, h, i, float(normal(rng)));
            k.store(b, pos, h, i, float(normal(rng)));
            v.store(b, pos, h, i, float(normal(rng)));
          }
        continue;
      }
      const double f = double(c.frame), y = double(c.patch / o.grid.width), x = double(c.patch % o.grid.width);
      fields[std::size_t(b)].at(f, y, x, field.data());
      for (std::int64_t h = 0; h < o.heads; ++h) {
        const HeadShape& s = shapes[std::size_t(h)];
        q.store(b, pos, h, 0, float(sink));
        q.store(b, pos, h, 1, 0.f);
        k.store(b, pos, h, 0, c.frame == 0 ? float(sink) : 0.f);
        k.store(b, pos, h, 1, 0.f);
        v.store(b, pos, h, 0, float(kValueNoise * normal(rng)));
        v.store(b, pos, h, 1, float(kValueNoise * normal(rng)));
        for (std::int64_t m = 1; m < pairs; ++m) {
          const double angle = s.wf[std::size_t(m)] * f + s.wy[std::size_t(m)] * y + s.wx[std::size_t(m)] * x + s.phase[std::size_t(m)];
          const double re = rotary_share * amplitude * std::cos(angle), im = rotary_share * amplitude * std::sin(angle);
          double cq[2] = {0, 0}, cv[2] = {0, 0};
          for (int ch = 0; ch < kFieldChannels; ++ch)
            for (int t = 0; t < 2; ++t) {
              cq[t] += field[std::size_t(ch)] * s.mix_qk[std::size_t(ch * d + 2 * m + t)];
              cv[t] += field[std::size_t(ch)] * s.mix_v[std::size_t(ch * d + 2 * m + t)];
            }
          const double content = o.content_weight * amplitude;
          q.store(b, pos, h, 2 * m, float(re + content * cq[0]));
          q.store(b, pos, h, 2 * m + 1, float(im + content * cq[1]));
          const double key_share = c.frame == 0 ? kAnchorRotaryShare : 1.0;
          k.store(b, pos, h, 2 * m, float(key_share * (re + content * cq[0])));
          k.store(b, pos, h, 2 * m + 1, float(key_share * (im + content * cq[1])));
          v.store(b, pos, h, 2 * m, float(cv[0] + kValueNoise * normal(rng)));
          v.store(b, pos, h, 2 * m + 1, float(cv[1] + kValueNoise * normal(rng)));
        }
      }
    }
  }
  return data;
}

}  // namespace stsa::synth
