// What Isa::Auto and threads = 0 resolve to: the process defaults (set_cpu_defaults),
// then STSA_ISA / STSA_THREADS, then the machine.
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "cpu/isa.hpp"
#include "stsa/cpu.hpp"
#include "stsa/error.hpp"

namespace stsa {
namespace {

constexpr int kMaxThreads = 4096;

// Read at the start of every call; a mutex rather than two atomics so that a
// reader never sees one field of a change without the other.
std::mutex& defaults_mutex() {
  static std::mutex mutex;
  return mutex;
}
CpuOptions& stored_defaults() {
  static CpuOptions defaults;
  return defaults;
}

}  // namespace

void set_cpu_defaults(CpuOptions defaults) {
  STSA_CHECK(defaults.threads >= 0 && defaults.threads <= kMaxThreads, InvalidArgument,
             "default threads must be in [0, 4096] (0: STSA_THREADS, then all), got ", defaults.threads);
  if (defaults.isa != Isa::Auto && !cpu::machine_supports(defaults.isa))
    throw Unsupported(detail::concat("default instruction set ", to_string(defaults.isa),
                                     ": this CPU lacks it (best: ", to_string(cpu::machine_best_isa()), ")"));
  const std::lock_guard<std::mutex> lock(defaults_mutex());
  stored_defaults() = defaults;
}

CpuOptions cpu_defaults() {
  const std::lock_guard<std::mutex> lock(defaults_mutex());
  return stored_defaults();
}

namespace cpu {

int threads_from(int requested, const CpuOptions& defaults, std::string& why) {
  if (requested > 0) return requested;
  if (const int chosen = defaults.threads; chosen > 0) return chosen;
  if (const char* env = std::getenv("STSA_THREADS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (*end != '\0' || n < 0 || n > kMaxThreads) {
      why = detail::concat("STSA_THREADS='", env, "' is not a thread count in [0, 4096]");
      return 1;
    }
    if (n > 0) return int(n);
  }
  // Read once: it costs a read of /sys (~2 us), and a thread count is resolved at every call.
  static const int hardware = int(std::max(1u, std::thread::hardware_concurrency()));
  return hardware;
}

}  // namespace cpu

Isa resolve_isa(Isa requested) {
  const cpu::IsaChoice choice = cpu::choose_isa(requested, cpu_defaults());
  if (choice.malformed) throw InvalidArgument("cpu backend: " + choice.why);
  if (!choice.why.empty()) throw Unsupported("cpu backend: " + choice.why);
  return choice.isa;
}

int resolve_threads(int requested) {
  STSA_CHECK(requested >= 0 && requested <= kMaxThreads, InvalidArgument,
             "threads must be in [0, 4096] (0: all), got ", requested);
  std::string why;
  const int threads = cpu::threads_from(requested, cpu_defaults(), why);
  if (!why.empty()) throw InvalidArgument(why);
  return threads;
}

}  // namespace stsa
