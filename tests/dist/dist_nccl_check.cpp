// The NCCL communicator with one rank on one GPU (NCCL refuses two ranks on
// one device, so multi-rank runs use MPI): an all-to-all on device buffers
// through grouped ncclSend/ncclRecv, the small collectives, and a Ulysses call
// on host tensors (staged through the device) that must equal the
// single-device path bit for bit. Exit 0: passed, 1: failed, 77: no GPU (skipped).
#include <cuda_runtime.h>

#include <cstdio>
#include <numeric>
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

void check_device_exchange(Communicator& nccl) {
  constexpr std::int64_t kBytes = 3 << 20;  // several MiB, offsets not multiples of anything nice
  std::vector<unsigned char> host(kBytes + 123);
  std::iota(host.begin(), host.end(), 0);
  void *send = nullptr, *recv = nullptr;
  cudaMalloc(&send, host.size());
  cudaMalloc(&recv, kBytes + 77);
  cudaMemcpy(send, host.data(), host.size(), cudaMemcpyHostToDevice);
  const std::int64_t counts[] = {kBytes}, send_offsets[] = {123}, recv_offsets[] = {77};
  nccl.alltoallv(static_cast<std::byte*>(send), counts, send_offsets, static_cast<std::byte*>(recv), counts,
                 recv_offsets);
  std::vector<unsigned char> back(kBytes);
  cudaMemcpy(back.data(), static_cast<unsigned char*>(recv) + 77, kBytes, cudaMemcpyDeviceToHost);
  expect(std::equal(back.begin(), back.end(), host.begin() + 123), "device all-to-all delivers the block");
  cudaFree(send);
  cudaFree(recv);

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
  auto single = stsa::testing::make_problem(l, DType::F32, dist_testing::reference_heads(l, masks), 11);
  PlanCache plans;
  const Backend& cpu = backend("cpu");
  dist_testing::run_single(single, masks, true, cpu, plans);
  auto rank = dist_testing::shard_problem(single, masks, 1, 0, true);
  const UlyssesReport report = ulysses_attention(nccl, rank.call, cpu, plans);
  const auto o = dist_testing::compare_tokens(rank.o.view(), single.o.view(), l.grid.video_begin(), l.grid.video_tokens());
  const auto lse = dist_testing::compare_lse(rank.lse.view(), single.lse.view(), l.grid.video_begin(), l.grid.video_tokens());
  expect(o.differing_bits == 0 && lse.differing_bits == 0, "Ulysses over NCCL equals the single-device path");
  expect(report.total.bytes_sent == 0 && report.local.collectives == 0, "Ulysses traffic on one rank is zero");
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device\n");
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
