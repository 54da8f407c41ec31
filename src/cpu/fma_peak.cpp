// measure_fma_peak_gflops: how many fp32 FLOP/s this machine's FMA units give
// with the best instruction set; measure_bf16_dot_peak_gflops and
// measure_amx_peak_gflops: the same for VDPBF16PS and for AMX bf16 tile products.
// They are the ceilings benchmarks report a fraction of.
// Each thread times its loop in its own CPU time, so other jobs on a shared
// machine slow the measurement down but do not lower the figure.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <thread>
#include <vector>

#include "core/worker_threads.hpp"
#include "cpu/isa.hpp"
#include "cpu/kernel.hpp"
#include "stsa/cpu.hpp"
#include "stsa/error.hpp"

namespace stsa {
namespace cpu {
namespace {

float fma_chains_portable(std::int64_t iterations) {
  float acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = float(i) * 1e-3f;
  for (std::int64_t it = 0; it < iterations; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = acc[i] * 0.999999f + 1e-7f;
  float sum = 0;
  for (float a : acc) sum += a;
  return sum;
}

using Chains = float (*)(std::int64_t iterations);

double measure_peak(Chains chains, int flops_per_iteration, int threads, double seconds);

}  // namespace

float fma_chains_scalar(std::int64_t iterations) { return fma_chains_portable(iterations); }
int fma_chain_flops_per_iteration_scalar() { return 12 * 2; }

}  // namespace cpu

double measure_fma_peak_gflops(int threads, double seconds) {
  const Isa isa = cpu::machine_best_isa();
  if (isa >= Isa::Avx512)
    return cpu::measure_peak(cpu::fma_chains_avx512, cpu::fma_chain_flops_per_iteration_avx512(), threads, seconds);
  if (isa == Isa::Avx2)
    return cpu::measure_peak(cpu::fma_chains_avx2, cpu::fma_chain_flops_per_iteration_avx2(), threads, seconds);
  return cpu::measure_peak(cpu::fma_chains_scalar, cpu::fma_chain_flops_per_iteration_scalar(), threads, seconds);
}

double measure_bf16_dot_peak_gflops(int threads, double seconds) {
  if (!cpu::machine_supports(Isa::Avx512))
    throw Unsupported("measure_bf16_dot_peak_gflops: this CPU gives no AVX-512 with BF16 (VDPBF16PS)");
  return cpu::measure_peak(cpu::bf16_dot_chains_avx512, cpu::bf16_dot_flops_per_iteration_avx512(), threads,
                           seconds);
}

double measure_amx_peak_gflops(int threads, double seconds) {
  if (!cpu::machine_supports(Isa::Amx))
    throw Unsupported("measure_amx_peak_gflops: this CPU (or its operating system) gives no AMX tiles");
  return cpu::measure_peak(cpu::tile_product_chains_amx, cpu::tile_product_flops_per_iteration_amx(), threads,
                           seconds);
}

namespace cpu {
namespace {

double measure_peak(Chains chains, int flops_per_iteration, int threads, double seconds) {
  // The bound every other entry point has: a huge count would only fail to allocate its per-thread slots.
  STSA_CHECK(threads >= 0 && threads <= 4096, InvalidArgument, "threads must be in [0, 4096] (0: all), got ", threads);
  STSA_CHECK(seconds > 0 && seconds <= 60, InvalidArgument, "seconds must be in (0, 60], got ", seconds);
  if (threads == 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));

  using Clock = std::chrono::steady_clock;
  constexpr std::int64_t kBatch = 1 << 16;  // iterations between clock reads
  auto thread_cpu_s = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  };
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::int64_t> iterations(std::size_t(threads), 0);
  std::vector<double> elapsed(std::size_t(threads), 0.0);
  std::vector<float> sink(std::size_t(threads), 0.0f);
  auto body = [&](int t) {
    ready.fetch_add(1);
    while (!go.load()) std::this_thread::yield();
    const auto wall_start = Clock::now();
    const double cpu_start = thread_cpu_s();
    std::int64_t done = 0;
    float s = 0;
    double secs = 0;
    do {
      s += chains(kBatch);
      done += kBatch;
      secs = thread_cpu_s() - cpu_start;
      // Give up waiting for CPU time on a badly oversubscribed machine.
    } while (secs < seconds && std::chrono::duration<double>(Clock::now() - wall_start).count() < 20 * seconds);
    iterations[std::size_t(t)] = done;
    elapsed[std::size_t(t)] = secs;
    sink[std::size_t(t)] = s;
  };
  detail::WorkerThreads pool(std::size_t(threads - 1));
  for (int t = 1; t < threads; ++t)
    if (!pool.start([&body, t] { body(t); })) break;
  // Threads the system refused are not measured (their rates stay out of the sum).
  threads = int(pool.size()) + 1;
  while (ready.load() < threads - 1) std::this_thread::yield();
  go.store(true);
  body(0);
  pool.join();

  // Sum of per-thread rates, each over its own CPU time; more threads than
  // hardware threads share the cores, so their sum is scaled back.
  double gflops = 0;
  for (int t = 0; t < threads; ++t)
    gflops += double(iterations[std::size_t(t)]) * flops_per_iteration / elapsed[std::size_t(t)] / 1e9;
  const int hardware = int(std::max(1u, std::thread::hardware_concurrency()));
  if (threads > hardware) gflops *= double(hardware) / double(threads);
  volatile float keep = sink[0];
  (void)keep;
  return gflops;
}

}  // namespace
}  // namespace cpu
}  // namespace stsa
