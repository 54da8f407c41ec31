// The MPI communicator (built when STSA_MPI is on and MPI is found).
//
// Every collective is posted non-blocking and then polled against the timeout,
// so a missing or stuck rank gives CommTimeout instead of a hang. The exchange
// is a set of Isend/Irecv pairs cut into chunks below 2^31 bytes, because MPI's
// counts are int and OpenMPI 4.1 has no large-count (MPI_Alltoallv_c) calls.
// Only MPI's C API: keep the deprecated C++ bindings (and their link dependency) out.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "stsa/dist.hpp"

namespace stsa::dist {
namespace {

constexpr std::int64_t kChunkBytes = std::int64_t(1) << 30;
constexpr int kExchangeTag = 0x5715;
constexpr int kBusyPolls = 2000;  // then sleep between polls so oversubscribed ranks leave the cores to others
constexpr auto kPollSleep = std::chrono::microseconds(50);

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw DistError(::stsa::detail::concat("MPI ", what, " failed: ", std::string(text, std::size_t(std::max(length, 0)))));
}

MPI_Op to_mpi(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Min: return MPI_MIN;
    case ReduceOp::Max: return MPI_MAX;
  }
  return MPI_SUM;
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "Comm_dup");
    // Errors come back as codes (turned into DistError) instead of aborting inside MPI.
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "Comm_size");
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  std::string_view name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MemorySpace memory() const override { return MemorySpace::Host; }
  [[noreturn]] void abort(int exit_code) override {
    MPI_Abort(comm_, exit_code);
    std::_Exit(exit_code);
  }

 protected:
  void do_alltoallv(const std::byte* send, std::span<const std::int64_t> send_counts,
                    std::span<const std::int64_t> send_offsets, std::byte* recv,
                    std::span<const std::int64_t> recv_counts, std::span<const std::int64_t> recv_offsets) override {
    std::vector<MPI_Request> requests;
    // Receives first, so that every send finds its match posted.
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      post_chunks(recv + recv_offsets[std::size_t(peer)], recv_counts[std::size_t(peer)], peer, false, requests);
    }
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      post_chunks(const_cast<std::byte*>(send + send_offsets[std::size_t(peer)]), send_counts[std::size_t(peer)],
                  peer, true, requests);
    }
    const auto self = std::size_t(rank_);
    STSA_CHECK(send_counts[self] == recv_counts[self], DistError, "alltoallv: rank ", rank_, " sends itself ",
               send_counts[self], " bytes but expects ", recv_counts[self]);
    if (send_counts[self] > 0)
      std::memmove(recv + recv_offsets[self], send + send_offsets[self], std::size_t(send_counts[self]));
    wait(requests, "all-to-all exchange");
  }

  void do_allgather(const void* mine, std::size_t bytes, void* all) override {
    STSA_CHECK(bytes <= std::size_t(INT_MAX), InvalidArgument, "allgather of ", bytes,
               " bytes per rank is beyond MPI's int counts");
    std::vector<MPI_Request> request(1);
    check_mpi(MPI_Iallgather(mine, int(bytes), MPI_BYTE, all, int(bytes), MPI_BYTE, comm_, request.data()),
              "Iallgather");
    wait(request, "allgather");
  }

  void do_allreduce(std::span<double> values, ReduceOp op) override {
    STSA_CHECK(values.size() <= std::size_t(INT_MAX), InvalidArgument, "allreduce of ", values.size(),
               " values is beyond MPI's int counts");
    std::vector<MPI_Request> request(1);
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_DOUBLE, to_mpi(op), comm_,
                             request.data()),
              "Iallreduce");
    wait(request, "allreduce");
  }

  void do_barrier() override {
    std::vector<MPI_Request> request(1);
    check_mpi(MPI_Ibarrier(comm_, request.data()), "Ibarrier");
    wait(request, "barrier");
  }

 private:
  void post_chunks(std::byte* data, std::int64_t bytes, int peer, bool is_send, std::vector<MPI_Request>& requests) {
    // Messages between one pair on one tag arrive in order, so chunks need no numbering.
    for (std::int64_t done = 0; done < bytes; done += kChunkBytes) {
      const int count = int(std::min(kChunkBytes, bytes - done));
      MPI_Request request;
      if (is_send)
        check_mpi(MPI_Isend(data + done, count, MPI_BYTE, peer, kExchangeTag, comm_, &request), "Isend");
      else
        check_mpi(MPI_Irecv(data + done, count, MPI_BYTE, peer, kExchangeTag, comm_, &request), "Irecv");
      requests.push_back(request);
    }
  }

  void wait(std::vector<MPI_Request>& requests, const char* what) {
    if (requests.empty()) return;
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      int done = 0;
      check_mpi(MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE), what);
      if (done) return;
      if (std::chrono::steady_clock::now() - start > timeout())
        throw CommTimeout(::stsa::detail::concat("rank ", rank_, " of ", size_, ": ", what, " did not complete within ",
                                         double(timeout().count()) / 1000.0,
                                         " s; a rank is missing, stuck or has failed"));
      if (polls < kBusyPolls)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(kPollSleep);
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

MpiSession::MpiSession() {
  int initialized = 0;
  check_mpi(MPI_Initialized(&initialized), "Initialized");
  if (initialized) return;
  // Only the thread that owns the session calls MPI; kernels may run threads of their own.
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "Init_thread");
  owns_ = true;
}

MpiSession::~MpiSession() {
  if (!owns_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::unique_ptr<Communicator> MpiSession::world() const { return std::make_unique<MpiCommunicator>(); }

}  // namespace stsa::dist
