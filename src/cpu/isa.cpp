#include "cpu/isa.hpp"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <string_view>

#include "stsa/error.hpp"

namespace stsa {

std::string_view to_string(Isa isa) {
  switch (isa) {
    case Isa::Auto:
      return "auto";
    case Isa::Scalar:
      return "scalar";
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512:
      return "avx512";
    case Isa::Amx:
      return "amx";
  }
  return "?";
}

Isa parse_isa(std::string_view name) {
  if (name == "auto") return Isa::Auto;
  if (name == "scalar") return Isa::Scalar;
  if (name == "avx2") return Isa::Avx2;
  if (name == "avx512") return Isa::Avx512;
  if (name == "amx") return Isa::Amx;
  throw InvalidArgument(
      detail::concat("unknown instruction set '", name, "' (expected auto, scalar, avx2, avx512 or amx)"));
}

Isa best_isa() {
  const Isa machine = cpu::machine_best_isa();
  const char* env = std::getenv("STSA_ISA");
  if (env == nullptr || *env == '\0') return machine;
  const Isa cap = parse_isa(env);
  if (cap == Isa::Auto) return machine;
  // Isa values are ordered Scalar < Avx2 < Avx512 < Amx, so the cap is a minimum.
  return cap < machine ? cap : machine;
}

namespace cpu {
namespace {

// Feature bits that Clang's __builtin_cpu_supports does not know (Clang 14:
// f16c, avx512bf16, amx-tile, amx-bf16), read from CPUID directly so that both
// compilers build this file. The OS side is checked elsewhere: AVX state by
// __builtin_cpu_supports("avx2"/"avx512f"), AMX state by amx_permitted().
enum class CpuidRegister { Eax, Ecx, Edx };
bool cpuid_bit(unsigned leaf, unsigned subleaf, CpuidRegister reg, unsigned bit) {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(leaf, subleaf, &eax, &ebx, &ecx, &edx) == 0) return false;
  const unsigned value = reg == CpuidRegister::Eax ? eax : reg == CpuidRegister::Ecx ? ecx : edx;
  return ((value >> bit) & 1u) != 0;
}
bool has_f16c() { return cpuid_bit(1, 0, CpuidRegister::Ecx, 29); }
bool has_avx512_bf16() { return cpuid_bit(7, 1, CpuidRegister::Eax, 5); }
bool has_amx_bf16() { return cpuid_bit(7, 0, CpuidRegister::Edx, 22); }
bool has_amx_tile() { return cpuid_bit(7, 0, CpuidRegister::Edx, 24); }

// Linux hands out the AMX register state only to processes that ask for it
// (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, once, for all threads); a kernel
// without AMX support, or a sigaltstack too small for the state, refuses.
bool amx_permitted() {
  static const bool permitted = [] {
    constexpr int kArchReqXcompPerm = 0x1023;
    constexpr int kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return permitted;
}

bool detect_support(Isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case Isa::Auto:
    case Isa::Scalar:
      return true;
    case Isa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case Isa::Avx512:
      // Everything the *_avx512.cpp files are compiled with, since the compiler may use any of it.
      return detect_support(Isa::Avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && has_avx512_bf16();
    case Isa::Amx:
      return detect_support(Isa::Avx512) && has_amx_tile() && has_amx_bf16() && amx_permitted();
  }
  return false;
}

}  // namespace

bool machine_supports(Isa isa) {
  // Detected once: under a hypervisor every CPUID traps (~66 us for one resolution of
  // Auto, measured), and the backends and the router resolve Auto at every call.
  static const std::array<bool, 5> supported = [] {
    std::array<bool, 5> table{};
    for (Isa i : {Isa::Auto, Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx}) table[std::size_t(i)] = detect_support(i);
    return table;
  }();
  const auto index = std::size_t(isa);
  return index < supported.size() && supported[index];
}

Isa machine_best_isa() {
  if (machine_supports(Isa::Amx)) return Isa::Amx;
  if (machine_supports(Isa::Avx512)) return Isa::Avx512;
  if (machine_supports(Isa::Avx2)) return Isa::Avx2;
  return Isa::Scalar;
}

IsaChoice choose_isa(Isa requested, const CpuOptions& defaults) {
  IsaChoice choice;
  if (requested == Isa::Auto) requested = defaults.isa;  // set_cpu_defaults comes before STSA_ISA
  if (requested == Isa::Auto) {
    // STSA_ISA picks the instruction set; naming one this CPU lacks is an error, not a silent downgrade.
    try {
      const char* env = std::getenv("STSA_ISA");
      const Isa from_env = env != nullptr && *env != '\0' ? parse_isa(env) : Isa::Auto;
      if (from_env != Isa::Auto && !machine_supports(from_env)) {
        choice.why =
            detail::concat("STSA_ISA=", env, " but this CPU lacks it (best: ", to_string(machine_best_isa()), ")");
        return choice;
      }
      choice.isa = best_isa();
    } catch (const InvalidArgument& e) {
      choice.why = detail::concat("STSA_ISA: ", e.what());
      choice.malformed = true;
    }
    return choice;
  }
  choice.isa = requested;
  if (!machine_supports(requested))
    choice.why = detail::concat("instruction set ", to_string(requested),
                                " was requested but this CPU lacks it (best: ", to_string(machine_best_isa()), ")");
  return choice;
}

}  // namespace cpu
}  // namespace stsa
