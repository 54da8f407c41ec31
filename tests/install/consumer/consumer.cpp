// The README's library call, from an installed stsa: a sparse call with text tokens and a
// ragged tile on the "cpu" backend, against the fp64 "reference" backend. Exit 0 when they agree.
#include <stsa/attention.hpp>
#include <stsa/version.hpp>

#include <cmath>
#include <cstdio>
#include <random>

int main() {
  stsa::VideoLayout layout{{/*frames*/ 5, /*height*/ 6, /*width*/ 7, /*text_tokens*/ 9}, /*batch*/ 1, /*heads*/ 2,
                           /*head_dim*/ 64};
  stsa::Tensor q(stsa::DType::F32, 1, layout.tokens(), 2, 64), k = q, v = q, o = q, expected = q;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (stsa::Tensor* t : {&q, &k, &v}) {
    const stsa::TensorView view = t->view();
    for (std::int64_t i = 0; i < view.numel(); ++i) static_cast<float*>(view.data)[i] = normal(rng);
  }
  stsa::PlanCache plans;
  const stsa::MaskSpec spatial = stsa::mask_for_density(layout.grid, stsa::SparseKind::Spatial, 0.3);
  const auto heads = stsa::uniform_heads(layout, spatial, plans);
  stsa::backend("cpu").run({layout, q.view(), k.view(), v.view(), o.view(), {}, heads});
  stsa::backend("reference").run({layout, q.view(), k.view(), v.view(), expected.view(), {}, heads});
  double worst = 0;
  const stsa::TensorView got = o.view(), want = expected.view();
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    worst = std::fmax(worst, std::fabs(static_cast<float*>(got.data)[i] - static_cast<float*>(want.data)[i]));
  }
  static_assert(STSA_VERSION_MAJOR >= 0 && STSA_VERSION_MINOR >= 0 && STSA_VERSION_PATCH >= 0);
  std::printf("stsa::stsa %.*s from an installed package: %lld tokens, max |cpu - reference| = %.3g\n",
              static_cast<int>(stsa::version.size()), stsa::version.data(), static_cast<long long>(layout.tokens()),
              worst);
  return worst < 1e-4 ? 0 : 1;
}
