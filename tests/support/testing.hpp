// Test helpers: fresh random problems, guarded outputs, and error bounds taken
// relative to what a same-precision naive implementation gets wrong against the
// fp64 reference (FlashAttention's rule: allow 2x that, plus a rounding floor).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "stsa/attention.hpp"
#include "stsa/plan.hpp"
#include "stsa/reference.hpp"
#include "stsa/tensor.hpp"
#include "support/error_pattern.hpp"

namespace stsa::testing {

// Whether this build runs under a sanitizer (gcc says so by macro, clang by __has_feature).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define STSA_TESTS_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define STSA_TESTS_SANITIZED 1
#endif
#endif
#ifdef STSA_TESTS_SANITIZED
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// Rows the big correctness matrices compare with the fp64 reference: every one (0)
// in a plain build, 64 sampled ones under a sanitizer, where the reference's
// instrumented loops were most of their time (CpuBackend.MatchesReferenceOnAwkwardShapes
// under ASan: 76 s with every row, 26 s with 64). The kernels still compute every
// row there, so the sanitizer sees all of their memory traffic.
inline constexpr int kMatrixRows = kSanitized ? 64 : 0;

// A seed that differs per run (fresh inputs) unless STSA_TEST_SEED fixes it; printed on failure.
std::uint64_t fresh_seed();

// Fills a tensor with N(0, stddev) values rounded to its dtype.
void fill_normal(const TensorView& t, std::uint64_t seed, float stddev = 1.0f);

// A finite value no output of these tests' inputs comes near (exact in every dtype, fp8 too).
inline constexpr float kFinitePoison = 256.0f;

// An output tensor with sentinel bytes before and after its storage, poisoned with NaN.
class GuardedTensor {
 public:
  GuardedTensor(DType dtype, std::int64_t batch, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                MemoryLayout layout = MemoryLayout::BNHD);
  // Made from the bytes held now, as stsa::Tensor's: a copy (a Problem copy)
  // sees its own bytes, a moved-from one a null view.
  TensorView view() const {
    TensorView v = shape_;
    v.data = storage_.empty() ? nullptr : const_cast<std::byte*>(storage_.data()) + kGuardBytes;
    return v;
  }
  void poison();               // every element NaN
  // Every element kFinitePoison, for tests whose expected outputs are NaN, which
  // the NaN poison would already satisfy where a kernel wrote nothing.
  void poison_finite();
  bool guards_intact() const;  // sentinels untouched

 private:
  static constexpr std::size_t kGuardBytes = 256;
  std::vector<std::byte> storage_;
  std::size_t payload_bytes_ = 0;
  TensorView shape_;  // dtype, shape and strides; data comes from storage_
};

class GuardedLse {
 public:
  GuardedLse(std::int64_t batch, std::int64_t heads, std::int64_t tokens);
  LseView view() const {
    LseView v = shape_;
    v.data = storage_.empty() ? nullptr : const_cast<float*>(storage_.data()) + kGuardFloats;
    return v;
  }
  void poison();
  void poison_finite();  // as GuardedTensor's
  bool guards_intact() const;

 private:
  static constexpr std::int64_t kGuardFloats = 64;
  std::vector<float> storage_;
  LseView shape_;  // shape and strides; data comes from storage_
};

// Inputs, outputs and masks of one random attention problem.
struct Problem {
  VideoLayout layout;
  DType dtype = DType::F32;
  MemoryLayout memory = MemoryLayout::BNHD;
  Tensor q, k, v;
  GuardedTensor o;
  GuardedLse lse;
  std::vector<HeadMask> heads;
  std::string label;  // printed on failure: shape, dtype, masks, seed
  float softmax_scale = 0.f;  // what call() passes (0: 1 / sqrt(D)); the reference reads it from there
  std::vector<float> q_descale = {}, k_descale = {}, v_descale = {};  // call()'s descales (empty: none)

  AttentionCall call() const;
};

// `call` narrowed to its first `heads` heads: layout, masks and the inputs' head
// extent (the output's is left as it is, for the scattered-output checks).
AttentionCall first_heads(AttentionCall call, std::int64_t heads);

// `count` descales, each in [1/4, 4] (a quantizer's amax / 448 lands anywhere).
std::vector<float> random_descales(std::int64_t count, std::mt19937_64& rng);

// Per-(batch, head) q, k and v descales for `p` from random_descales, seeded: ranks
// given the same seed get the same factors.
void give_descales(Problem& p, std::uint64_t seed);

// Scores at the float limit, with a softmax scale of 1: channel 0 of q is +2^64 on rows n % 3 == 1,
// -2^64 on rows n % 3 == 2 and 0 on the others; channel 0 of every key is 2^63 x [1.5, 1.8], in the
// 39 bf16 steps there. The planted rows score +-(2.6-3.1)e38 (the other channels' sums are lost
// under their last bit, in fp32 and fp64 alike, so ties are exact ties everywhere): finite in fp32,
// times the scale too, but past FLT_MAX once times log2 e. A kernel whose exp2 offset is
// max x scale x log2 e gets an infinite one there. fp32 or bf16 inputs (fp16 cannot hold 2^64).
void plant_scores_at_the_float_limit(Problem& p, std::uint64_t seed);

// The planted rows against the fp64 reference. Each one's O is the mean of V over its exact ties,
// so a kernel right there is off by its output's rounding only; compare_with_reference's bound
// allows their score rounding too (~1e31). NaN counts as infinite.
struct FloatLimitErrors {
  double o_max_abs = 0;   // over every planted row, head and channel
  double lse_max_rel = 0; // |LSE - reference| / |reference| (both -inf: 0)
  std::int64_t rows = 0;
};
FloatLimitErrors float_limit_errors(const Problem& p);

// One mask per head, cycling spatial, temporal (spatial-major tokens) and frame-window masks
// sized to `density`, with their 64 x 64 tile plans from `plans`.
std::vector<HeadMask> mixed_heads(const VideoLayout& layout, double density, PlanCache& plans);

// Random Q/K/V for `layout` in `dtype`, with `heads` masks (one per head).
Problem make_problem(const VideoLayout& layout, DType dtype, std::vector<HeadMask> heads, std::uint64_t seed,
                     MemoryLayout memory = MemoryLayout::BNHD, DType out_dtype = DType::F32);

struct Comparison {
  double max_abs_err = 0, rel_l2_err = 0, lse_max_abs_err = 0;  // backend vs fp64 reference
  double naive_max_abs_err = 0, naive_lse_max_abs_err = 0;       // same-precision naive vs reference
  double tolerance = 0, lse_tolerance = 0;
  bool all_finite_where_expected = true;  // NaN anywhere a finite value is expected fails
  bool guards_intact = true;
  std::string failure;  // empty when the comparison passes; else says what and where (error_pattern)
  ReferenceRows reference;  // the rows compared and their fp64 reference, for other bounds' patterns
  bool ok() const { return failure.empty(); }
};

// Compares the problem's output (after a backend ran on problem.call()) with the
// fp64 reference on every row (or on `sample_rows` random rows when > 0).
Comparison compare_with_reference(const Problem& problem, int sample_rows = 0, std::uint64_t seed = 1,
                                  const PairPredicate& override_mask = {});

}  // namespace stsa::testing
