// The NCCL communicator (built when STSA_CUDA is on and NCCL is found).
//
// The all-to-all is a group of ncclSend/ncclRecv pairs on device buffers (host
// buffers are staged through device memory). The communicator is created in
// NCCL's non-blocking mode and every operation is polled against the timeout
// (stream query + async error), so a missing rank gives CommTimeout and an
// aborted communicator instead of a hang. NCCL refuses two ranks on one GPU, so
// multi-rank tests on one machine run over MPI; this path runs on GPU machines.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "stsa/dist.hpp"

namespace stsa::dist {
namespace {

using ::stsa::detail::concat;

constexpr std::size_t kMessageBytes = 200;
constexpr auto kPollSleep = std::chrono::microseconds(20);

void check_cuda(cudaError_t code, const char* what) {
  STSA_CHECK(code == cudaSuccess, DistError, "CUDA ", what, " failed: ", cudaGetErrorString(code));
}

// ncclInProgress is success-so-far in non-blocking mode: completion is polled later.
void check_nccl(ncclResult_t code, const char* what) {
  STSA_CHECK(code == ncclSuccess || code == ncclInProgress, DistError, "NCCL ", what,
             " failed: ", ncclGetErrorString(code));
}

bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();  // plain host memory on old runtimes; clear the sticky-free error
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

// Device memory that only grows.
class DeviceScratch {
 public:
  ~DeviceScratch() {
    if (data_ != nullptr) cudaFree(data_);
  }
  std::byte* get(std::size_t bytes) {
    if (bytes > size_) {
      if (data_ != nullptr) cudaFree(data_);
      data_ = nullptr;
      size_ = 0;
      void* p = nullptr;
      check_cuda(cudaMalloc(&p, std::max<std::size_t>(bytes, 256)), "cudaMalloc (exchange staging)");
      data_ = static_cast<std::byte*>(p);
      size_ = std::max<std::size_t>(bytes, 256);
    }
    return data_;
  }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// What every rank tells the others before NCCL starts: whether its device is usable, and rank 0's id.
struct Hello {
  std::int32_t ok = 0;
  char message[kMessageBytes] = {};
  ncclUniqueId id{};
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, int device) : rank_(bootstrap.rank()), size_(bootstrap.size()) {
    set_timeout(bootstrap.timeout());
    Hello mine;
    try {
      int devices = 0;
      check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
      STSA_CHECK(devices > 0, Unsupported, "no CUDA device is visible");
      device_ = device >= 0 ? device : rank_ % devices;
      STSA_CHECK(device_ < devices, InvalidArgument, "CUDA device ", device_, " requested, ", devices, " visible");
      check_cuda(cudaSetDevice(device_), "cudaSetDevice");
      if (rank_ == 0) check_nccl(ncclGetUniqueId(&mine.id), "GetUniqueId");
      mine.ok = 1;
    } catch (const Error& e) {
      std::strncpy(mine.message, e.what(), kMessageBytes - 1);
    }
    // Every rank learns whether every other rank can take part before any of them starts NCCL.
    std::vector<Hello> all(static_cast<std::size_t>(size_));
    bootstrap.allgather(&mine, sizeof(Hello), all.data());
    std::string failures;
    for (int r = 0; r < size_; ++r)
      if (!all[std::size_t(r)].ok)
        failures += concat(failures.empty() ? "" : "; ", "rank ", r, ": ",
                           std::string(all[std::size_t(r)].message, strnlen(all[std::size_t(r)].message, kMessageBytes)));
    STSA_CHECK(failures.empty(), DistError, "NCCL communicator not created (", failures, ")");

    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check_nccl(ncclCommInitRankConfig(&comm_, size_, all[0].id, rank_, &config), "CommInitRankConfig");
    wait_ready("communicator setup");
  }

  ~NcclCommunicator() override {
    if (comm_ != nullptr) {
      if (healthy_)
        ncclCommDestroy(comm_);
      else
        ncclCommAbort(comm_);
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  std::string_view name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MemorySpace memory() const override { return MemorySpace::Device; }
  [[noreturn]] void abort(int exit_code) override {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    std::_Exit(exit_code);
  }

 protected:
  void do_alltoallv(const std::byte* send, std::span<const std::int64_t> send_counts,
                    std::span<const std::int64_t> send_offsets, std::byte* recv,
                    std::span<const std::int64_t> recv_counts, std::span<const std::int64_t> recv_offsets) override {
    const std::size_t self = std::size_t(rank_);
    STSA_CHECK(send_counts[self] == recv_counts[self], DistError, "alltoallv: rank ", rank_, " sends itself ",
               send_counts[self], " bytes but expects ", recv_counts[self]);
    const std::int64_t send_extent = extent(send_counts, send_offsets), recv_extent = extent(recv_counts, recv_offsets);
    // Host buffers go through device staging so that callers need not care where their data lives.
    const bool stage_send = send_extent > 0 && !is_device_pointer(send);
    const bool stage_recv = recv_extent > 0 && !is_device_pointer(recv);
    const std::byte* dsend = send;
    std::byte* drecv = recv;
    if (stage_send) {
      std::byte* staged = send_staging_.get(std::size_t(send_extent));
      check_cuda(cudaMemcpyAsync(staged, send, std::size_t(send_extent), cudaMemcpyHostToDevice, stream_), "copy to device");
      dsend = staged;
    }
    if (stage_recv) drecv = recv_staging_.get(std::size_t(recv_extent));
    // The caller's device buffers may still be written or read by work it issued on
    // any stream, which this communicator's non-blocking stream does not follow: the
    // exchange, a blocking call, starts after all of it.
    if ((send_extent > 0 && !stage_send) || (recv_extent > 0 && !stage_recv))
      check_cuda(cudaDeviceSynchronize(), "synchronize before the exchange");

    // The rank's own block goes through NCCL too (send/recv to self is allowed), so
    // a one-rank run on one GPU exercises the same grouped calls as a real job.
    check_nccl(ncclGroupStart(), "GroupStart");
    for (int peer = 0; peer < size_; ++peer) {
      const std::size_t p = std::size_t(peer);
      if (send_counts[p] > 0)
        check_nccl(ncclSend(dsend + send_offsets[p], std::size_t(send_counts[p]), ncclUint8, peer, comm_, stream_), "Send");
      if (recv_counts[p] > 0)
        check_nccl(ncclRecv(drecv + recv_offsets[p], std::size_t(recv_counts[p]), ncclUint8, peer, comm_, stream_), "Recv");
    }
    check_nccl(ncclGroupEnd(), "GroupEnd");
    wait_ready("all-to-all exchange");
    if (stage_recv)
      check_cuda(cudaMemcpyAsync(recv, drecv, std::size_t(recv_extent), cudaMemcpyDeviceToHost, stream_), "copy to host");
    wait_stream("all-to-all exchange");
  }

  void do_allgather(const void* mine, std::size_t bytes, void* all) override {
    if (bytes == 0) return;
    std::byte* in = send_staging_.get(bytes);
    std::byte* out = recv_staging_.get(bytes * std::size_t(size_));
    check_cuda(cudaMemcpyAsync(in, mine, bytes, cudaMemcpyHostToDevice, stream_), "copy to device");
    check_nccl(ncclAllGather(in, out, bytes, ncclUint8, comm_, stream_), "AllGather");
    wait_ready("allgather");
    check_cuda(cudaMemcpyAsync(all, out, bytes * std::size_t(size_), cudaMemcpyDeviceToHost, stream_), "copy to host");
    wait_stream("allgather");
  }

  void do_allreduce(std::span<double> values, ReduceOp op) override {
    if (values.empty()) return;
    std::byte* buffer = send_staging_.get(values.size_bytes());
    check_cuda(cudaMemcpyAsync(buffer, values.data(), values.size_bytes(), cudaMemcpyHostToDevice, stream_),
               "copy to device");
    check_nccl(ncclAllReduce(buffer, buffer, values.size(), ncclDouble, to_nccl(op), comm_, stream_), "AllReduce");
    wait_ready("allreduce");
    check_cuda(cudaMemcpyAsync(values.data(), buffer, values.size_bytes(), cudaMemcpyDeviceToHost, stream_),
               "copy to host");
    wait_stream("allreduce");
  }

  // NCCL has no barrier: a one-value allreduce is one.
  void do_barrier() override {
    double token = 0.0;
    do_allreduce(std::span<double>(&token, 1), ReduceOp::Sum);
  }

 private:
  static std::int64_t extent(std::span<const std::int64_t> counts, std::span<const std::int64_t> offsets) {
    std::int64_t end = 0;
    for (std::size_t i = 0; i < counts.size(); ++i)
      if (counts[i] > 0) end = std::max(end, offsets[i] + counts[i]);
    return end;
  }

  [[noreturn]] void fail_timeout(const char* what) {
    healthy_ = false;
    ncclCommAbort(comm_);
    comm_ = nullptr;
    throw CommTimeout(concat("rank ", rank_, " of ", size_, ": NCCL ", what, " did not complete within ",
                             double(timeout().count()) / 1000.0, " s; a rank is missing, stuck or has failed"));
  }

  void check_async(const char* what, bool* in_progress) {
    ncclResult_t state = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm_, &state), "CommGetAsyncError");
    if (state != ncclSuccess && state != ncclInProgress) {
      healthy_ = false;
      throw DistError(concat("NCCL ", what, " failed: ", ncclGetErrorString(state)));
    }
    *in_progress = state == ncclInProgress;
  }

  // Non-blocking mode: an enqueued operation (or the setup) may still be in progress inside NCCL.
  void wait_ready(const char* what) {
    const auto start = std::chrono::steady_clock::now();
    for (bool busy = true;;) {
      check_async(what, &busy);
      if (!busy) return;
      if (std::chrono::steady_clock::now() - start > timeout()) fail_timeout(what);
      std::this_thread::sleep_for(kPollSleep);
    }
  }

  void wait_stream(const char* what) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t state = cudaStreamQuery(stream_);
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) {
        healthy_ = false;
        check_cuda(state, what);
      }
      bool busy = false;
      check_async(what, &busy);
      if (std::chrono::steady_clock::now() - start > timeout()) fail_timeout(what);
      std::this_thread::sleep_for(kPollSleep);
    }
  }

  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  bool healthy_ = true;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  DeviceScratch send_staging_, recv_staging_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device) {
  return std::make_unique<NcclCommunicator>(bootstrap, device);
}

}  // namespace stsa::dist
