// The attention kernel for AVX-512 (built with the flags src/cpu/CMakeLists.txt gives *_avx512.cpp).
#include "cpu/intrinsics.hpp"

#include "cpu/kernel.hpp"

namespace stsa::cpu {
namespace {

#include "cpu/vec_avx512.hpp"
// After Vec and the register budget, which it is written against:
#include "cpu/kernel_impl.hpp"

}  // namespace

AttendFn attend_avx512(int head_dim) { return attend_for(head_dim); }

}  // namespace stsa::cpu
