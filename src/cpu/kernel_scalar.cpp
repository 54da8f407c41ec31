// The portable attention kernel: the same algorithm as the SIMD ones with one
// float per "register", for CPUs without AVX2 and as a cross-check in tests.
#include "cpu/kernel.hpp"

namespace stsa::cpu {
namespace {

struct Vec {
  static constexpr bool kHasBf16Dot = false;
  static constexpr int W = 1;
  using reg = float;
  static reg load(const float* p) { return *p; }
  static void store(float* p, reg x) { *p = x; }
  static reg zero() { return 0.0f; }
  static reg set1(float x) { return x; }
  static reg fmadd(reg a, reg b, reg c) { return a * b + c; }
  static reg mul(reg a, reg b) { return a * b; }
  static reg add(reg a, reg b) { return a + b; }
  static reg sub(reg a, reg b) { return a - b; }
  static reg max(reg a, reg b) { return b > a || b != b ? b : a; }  // NaN-propagating like MAXPS(a, b)
  static float reduce_max(reg x) { return x; }
  static float reduce_add(reg x) { return x; }
  static reg select(unsigned bits, reg x, reg fill) { return (bits & 1u) ? x : fill; }
  static reg exp2(reg x) { return __builtin_exp2f(x); }
};

constexpr int kQkRows = 4;
constexpr int kQkVecs = 4;
constexpr int kPvAccumulators = 16;
constexpr int kPvMaxVecs = 4;
constexpr int kSoftmaxRows = 2;

#include "cpu/kernel_impl.hpp"

}  // namespace

AttendFn attend_scalar(int head_dim) { return attend_for(head_dim); }

}  // namespace stsa::cpu
