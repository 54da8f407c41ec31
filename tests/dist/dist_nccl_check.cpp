// The NCCL communicator with one rank on one GPU (NCCL refuses two ranks on
// one device, so multi-rank runs use MPI): an all-to-all on device buffers
// through grouped ncclSend/ncclRecv, the small collectives, and a Ulysses call
// on host tensors (staged through the device) that must equal the
// single-device path bit for bit. Exit 0: passed, 1: failed, 77: no GPU
// (skipped; a failure where STSA_GPU_REQUIRED is set, as in the GPU tests).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <string>

#include "dist_testing.hpp"

namespace {

using namespace stsa;
using namespace stsa::dist;

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  failures += ok ? 0 : 1;
}

// A failed CUDA call ends the check (main reports it as a failure).
void check_cuda(cudaError_t code, const char* what) {
  if (code != cudaSuccess) throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(code));
}

void check_device_exchange(Communicator& nccl) {
  constexpr std::int64_t kBytes = 3 << 20;  // several MiB, offsets not multiples of anything nice
  const std::size_t host_bytes = kBytes + 123;
  unsigned char* host = nullptr;  // pinned: the upload below is truly asynchronous
  check_cuda(cudaMallocHost(reinterpret_cast<void**>(&host), host_bytes), "cudaMallocHost");
  std::iota(host, host + host_bytes, 0);
  void *send = nullptr, *recv = nullptr;
  check_cuda(cudaMalloc(&send, host_bytes), "cudaMalloc");
  check_cuda(cudaMalloc(&recv, kBytes + 77), "cudaMalloc");
  // The caller's work still in flight on a stream of its own when the exchange is
  // called: the upload of what is sent and the poison of what is received (a block
  // not delivered, or delivered before the poison landed, shows). The exchange
  // must start after both (alltoallv's contract).
  cudaStream_t caller = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking), "cudaStreamCreate");
  check_cuda(cudaMemsetAsync(recv, 0xFF, kBytes + 77, caller), "cudaMemsetAsync");
  check_cuda(cudaMemcpyAsync(send, host, host_bytes, cudaMemcpyHostToDevice, caller), "cudaMemcpyAsync to device");
  const std::int64_t counts[] = {kBytes}, send_offsets[] = {123}, recv_offsets[] = {77};
  nccl.alltoallv(static_cast<std::byte*>(send), counts, send_offsets, static_cast<std::byte*>(recv), counts,
                 recv_offsets);
  check_cuda(cudaStreamDestroy(caller), "cudaStreamDestroy");
  std::vector<unsigned char> back(kBytes + 77);
  check_cuda(cudaMemcpy(back.data(), recv, back.size(), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  expect(std::equal(back.begin() + 77, back.end(), host + 123), "device all-to-all delivers the block");
  expect(std::all_of(back.begin(), back.begin() + 77, [](unsigned char b) { return b == 0xFF; }),
         "device all-to-all leaves the bytes before the block alone");
  check_cuda(cudaFree(send), "cudaFree");
  check_cuda(cudaFree(recv), "cudaFree");
  check_cuda(cudaFreeHost(host), "cudaFreeHost");

  std::int64_t mine = 1234567, all = 0;
  nccl.allgather(&mine, sizeof mine, &all);
  expect(all == mine, "allgather");
  double values[] = {2.5, -1.0};
  nccl.allreduce(values, ReduceOp::Max);
  expect(values[0] == 2.5 && values[1] == -1.0, "allreduce");
  nccl.barrier();
  expect(nccl.traffic().bytes_sent == 0, "a rank's block to itself is not traffic");
}

void check_ulysses(Communicator& nccl) {
  VideoLayout l;
  l.grid = VideoGrid{3, 5, 7, 6, TextPlacement::Before};
  l.heads = 4;
  l.head_dim = 64;
  const auto masks = dist_testing::mixed_masks(l.grid, l.heads, 0.25);
  auto single = stsa::testing::make_problem(l, DType::F32, dist_testing::reference_heads(l, masks),
                                            stsa::testing::fresh_seed());
  PlanCache plans;
  const Backend& cpu = backend("cpu");
  dist_testing::run_single(single, masks, true, cpu, plans);
  auto rank = dist_testing::shard_problem(single, masks, 1, 0, true);
  const UlyssesReport report = ulysses_attention(nccl, rank.call, cpu, plans);
  const VideoGrid& g = l.grid;
  const std::int64_t text_begin = g.text_placement == TextPlacement::Before ? 0 : g.video_end();
  const auto o = dist_testing::compare_tokens(rank.o.view(), single.o.view(), g.video_begin(), g.video_tokens());
  const auto lse = dist_testing::compare_lse(rank.lse.view(), single.lse.view(), g.video_begin(), g.video_tokens());
  // The text rows come back through the gather exchange on their own.
  const auto text_o = dist_testing::compare_tokens(rank.text_o.view(), single.o.view(), text_begin, g.text_tokens);
  const auto text_lse = dist_testing::compare_lse(rank.text_lse.view(), single.lse.view(), text_begin, g.text_tokens);
  const std::string where = " (" + single.label + ")";  // its seed: STSA_TEST_SEED reruns it
  expect(o.differing_bits == 0 && lse.differing_bits == 0,
         "Ulysses over NCCL: video rows equal the single-device path" + where);
  expect(text_o.differing_bits == 0 && text_lse.differing_bits == 0,
         "Ulysses over NCCL: text rows equal the single-device path" + where);
  expect(report.total.bytes_sent == 0 && report.local.collectives == 0, "Ulysses traffic on one rank is zero");
}

}  // namespace

int main() {
  int devices = 0;
  const cudaError_t found = cudaGetDeviceCount(&devices);
  if (found != cudaSuccess || devices == 0) {
    const char* why = found != cudaSuccess ? cudaGetErrorString(found) : "no device";
    if (std::getenv("STSA_GPU_REQUIRED") != nullptr) {
      std::printf("FAIL STSA_GPU_REQUIRED is set, but no CUDA device: %s\n", why);
      return 1;
    }
    std::printf("skipped: no CUDA device: %s\n", why);
    return 77;
  }
  try {
    auto bootstrap = make_local_communicator();
    auto nccl = make_nccl_communicator(*bootstrap, 0);
    expect(nccl->name() == "nccl" && nccl->size() == 1 && nccl->rank() == 0, "one-rank NCCL communicator");
    check_device_exchange(*nccl);
    check_ulysses(*nccl);
  } catch (const std::exception& e) {
    std::printf("FAIL %s\n", e.what());
    return 1;
  }
  std::printf("%s\n", failures == 0 ? "dist_nccl_check: passed" : "dist_nccl_check: FAILED");
  return failures == 0 ? 0 : 1;
}
