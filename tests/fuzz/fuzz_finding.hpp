// A fuzzer's finding: what went wrong on stderr, under the fuzzer's name, then abort
// (libFuzzer keeps the input that did it).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace stsa::fuzz {

[[noreturn]] inline void finding(const char* fuzzer, const char* what) {
  std::fprintf(stderr, "%s: %s\n", fuzzer, what);
  std::abort();
}

inline void require(bool ok, const char* fuzzer, const char* what) {
  if (!ok) finding(fuzzer, what);
}

}  // namespace stsa::fuzz
