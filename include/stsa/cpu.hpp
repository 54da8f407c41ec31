// The CPU backend: flash-style online softmax over a tile plan, SIMD kernels
// chosen at run time (AMX tiles for bf16, fp16 and fp8, AVX-512, AVX2+FMA, scalar), all cores.
#pragma once

#include <memory>
#include <string_view>

#include "stsa/attention.hpp"

namespace stsa {

// Amx: AVX-512 plus AMX tile products for calls whose Q, K and V are all bf16, all
// fp16 (each value as two bf16 parts) or all fp8 (as bf16), any head dim up to 128
// (run padded to the next of 64, 96 and 128 the tile kernel is built for); every
// other call runs the AVX-512 kernel. P enters P V as three bf16 parts for an fp32
// output (exact), two for an fp16 output or fp16 inputs (to within 2^-16), and
// rounded to bf16 for a bf16 output from bf16 or fp8 inputs, as bf16 FlashAttention
// kernels do: within the bound every kernel meets (README.md has the figures).
// Avx512 (which includes BF16): bf16 and fp8 Q K^T through VDPBF16PS, and P V too,
// with P rounded to bf16 likewise, where the output is bf16.
enum class Isa : std::uint8_t { Auto, Scalar, Avx2, Avx512, Amx };
std::string_view to_string(Isa isa);
Isa parse_isa(std::string_view name);  // "auto" | "scalar" | "avx2" | "avx512" | "amx"
Isa best_isa();                        // what this machine supports (STSA_ISA in the environment caps it)

struct CpuOptions {
  // Auto: the process default, STSA_ISA, the machine's best. It bounds what an attention call runs:
  // the kernel and the loaders, packers and stores around it (the same bits whichever they use).
  Isa isa = Isa::Auto;
  int threads = 0;      // 0: the process default, STSA_THREADS, all hardware threads
};

// A backend resolves Auto and 0 at each call, so set_cpu_defaults reaches it
// (and the backend the registry holds) from the next call on.
std::unique_ptr<Backend> make_cpu_backend(CpuOptions options = {});

// The process defaults: what Isa::Auto and threads = 0 mean for the CPU backends,
// the router and the permutation, from their next call on (a call running keeps
// what it started with). They come before STSA_ISA and STSA_THREADS; {Auto, 0},
// the initial value, defers to those. Throws Unsupported for an instruction set
// this CPU lacks and InvalidArgument for threads outside [0, 4096], and then
// changes nothing. Python's stsa.set_num_threads and stsa.set_isa set them.
void set_cpu_defaults(CpuOptions defaults);
CpuOptions cpu_defaults();

// What a call with these options runs now: the instruction set (Auto resolved
// through the defaults, STSA_ISA and the machine; throws Unsupported for one this
// CPU lacks, InvalidArgument for an STSA_ISA that names none) and the thread count
// (0 resolved through the defaults, STSA_THREADS, then all hardware threads;
// InvalidArgument for a malformed STSA_THREADS). A backend's run() throws the same
// kinds for the same settings.
Isa resolve_isa(Isa requested);
int resolve_threads(int requested);

// The kernel the CPU backend running `isa` (resolved, not Auto: InvalidArgument, as
// for any value that is no instruction set) computes `call` with: Amx for the calls
// the tile kernel takes, Avx512 for the others under Amx, else `isa`.
Isa kernel_isa(Isa isa, const AttentionCall& call);

// The head dim that kernel computes `call` at: the call's own, or the next one it
// is built for, the channels between packed as zeros (work the rates in a FLOP
// count of the call's head dim do not see); 0 where none takes it (the backend
// refuses such a call).
std::int64_t kernel_head_dim(Isa isa, const AttentionCall& call);

// The units that kernel computes `call`'s products on, whose measured peak (below) bounds its
// rate: AMX tile products; VDPBF16PS for both Q K^T and P V (the AVX-512 kernel given bf16 or fp8
// Q, K and V and a bf16 O); else FMAs. (The AVX-512 kernel with bf16 Q and K and an fp32 or fp16
// O takes only Q K^T from VDPBF16PS: Fma, which it may exceed by up to a third.)
enum class ProductUnits : std::uint8_t { Fma, Bf16Dot, AmxTiles };
ProductUnits kernel_product_units(Isa isa, const AttentionCall& call);
std::string_view to_string(ProductUnits units);  // "fma" | "bf16_dot" | "amx"

// Measured fused-multiply-add peak of this machine with `threads` threads (0: all), GFLOP/s.
double measure_fma_peak_gflops(int threads = 0, double seconds = 0.2);
// Measured peak of VDPBF16PS bf16 dot products (AVX-512 BF16), GFLOP/s; Unsupported without them.
double measure_bf16_dot_peak_gflops(int threads = 0, double seconds = 0.2);
// Measured peak of AMX bf16 tile products (TDPBF16PS), GFLOP/s; Unsupported without AMX.
double measure_amx_peak_gflops(int threads = 0, double seconds = 0.2);

}  // namespace stsa
