// Which instruction set the CPU kernels may use on this machine.
#pragma once

#include <string>

#include "stsa/cpu.hpp"

namespace stsa::cpu {

// True when this CPU (and OS) can run the kernels built for `isa`. Auto and Scalar: always.
bool machine_supports(Isa isa);
// The best instruction set of this machine, ignoring STSA_ISA.
Isa machine_best_isa();
// The instruction set a backend built with `requested` runs: an explicit request
// is taken as is, Auto means the process default (`defaults`, one cpu_defaults()
// read), else best_isa(). Returns an empty `why` when this machine can run it, otherwise the
// reason: `malformed` when STSA_ISA names no instruction set (the caller's mistake:
// InvalidArgument), else this CPU lacks the one asked for (Unsupported).
struct IsaChoice {
  Isa isa = Isa::Scalar;
  std::string why;
  bool malformed = false;
};
IsaChoice choose_isa(Isa requested, const CpuOptions& defaults);

// The thread count a backend built with `requested` runs (defaults.cpp): requested
// when > 0, else the process default (`defaults`), STSA_THREADS, all hardware
// threads. A malformed STSA_THREADS sets `why` (and gives 1). A call resolves both
// from one cpu_defaults() read, so it never takes one field of a change without the other.
int threads_from(int requested, const CpuOptions& defaults, std::string& why);

}  // namespace stsa::cpu
