// STSA_VECTOR_CLONES: the router's loops compiled for AVX-512, AVX2 + FMA and
// plain x86-64, picked at load time, so the library needs no -march flag.
#pragma once

#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")  // let the multiply-adds become FMAs
#endif

// Not under ThreadSanitizer: the clones' ifunc resolvers run while the dynamic
// loader relocates, before the TSan runtime is up, and their instrumentation crashes.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define STSA_VECTOR_CLONES __attribute__((target_clones("avx512f", "fma", "default")))
#else
#define STSA_VECTOR_CLONES
#endif
