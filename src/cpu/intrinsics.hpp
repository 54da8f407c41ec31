// <immintrin.h> for the files built with per-ISA flags (src/cpu/CMakeLists.txt),
// with GCC's false positive silenced: its AVX-512 intrinsics pass an unset
// "undefined" operand to their builtins, which -Wmaybe-uninitialized reports at
// every inlined call. (Clang has neither the warning nor the false positive.)
#pragma once

#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
