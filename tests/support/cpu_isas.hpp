// The CPU backend's instruction sets this machine runs, for tests that loop
// over them. Header-only: stsa_testing links the core rooms only, and the
// tests that include this link the CPU backend anyway.
#pragma once

#include <vector>

#include "cpu/isa.hpp"
#include "stsa/cpu.hpp"

namespace stsa::testing {

inline std::vector<Isa> isas_of_this_machine() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx})
    if (cpu::machine_supports(isa)) out.push_back(isa);
  return out;
}

}  // namespace stsa::testing
