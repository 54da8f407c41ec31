// The communicator's shared part (argument checks, traffic counting, timeout)
// and the single-rank LocalCommunicator.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "stsa/dist.hpp"

namespace stsa::dist {
namespace {

constexpr double kDefaultTimeoutSeconds = 120.0;

// Unset or empty: the default. Anything else must be seconds in (0, 1e7): a typo refused, not
// replaced by 120 s the user did not ask for (as STSA_THREADS is).
std::chrono::milliseconds timeout_from_environment() {
  const char* text = std::getenv("STSA_DIST_TIMEOUT");
  if (text == nullptr || *text == '\0') return std::chrono::milliseconds(std::int64_t(kDefaultTimeoutSeconds * 1000.0));
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  STSA_CHECK(end != text && *end == '\0' && seconds > 0 && seconds < 1e7, InvalidArgument,
             "STSA_DIST_TIMEOUT must be seconds in (0, 1e7), got '", text, "'");
  // Rounded up: a timeout below a millisecond is one millisecond, never zero.
  return std::chrono::milliseconds(std::int64_t(std::ceil(seconds * 1000.0)));
}

void check_exchange_spans(int size, std::span<const std::int64_t> counts, std::span<const std::int64_t> offsets,
                          const char* side) {
  STSA_CHECK(counts.size() == std::size_t(size) && offsets.size() == std::size_t(size), InvalidArgument,
             "alltoallv: ", side, " counts/offsets have ", counts.size(), "/", offsets.size(), " entries, expected ",
             size, " (one per rank)");
  for (int r = 0; r < size; ++r)
    STSA_CHECK(counts[std::size_t(r)] >= 0 && offsets[std::size_t(r)] >= 0, InvalidArgument, "alltoallv: ", side,
               " count/offset for rank ", r, " is negative (", counts[std::size_t(r)], ", ", offsets[std::size_t(r)],
               ")");
}

std::int64_t sum_except(std::span<const std::int64_t> counts, int self) {
  std::int64_t total = 0;
  for (std::size_t r = 0; r < counts.size(); ++r)
    if (int(r) != self) total += counts[r];
  return total;
}

class LocalCommunicator final : public Communicator {
 public:
  std::string_view name() const override { return "local"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  MemorySpace memory() const override { return MemorySpace::Host; }
  [[noreturn]] void abort(int exit_code) override { std::exit(exit_code); }

 protected:
  void do_alltoallv(const std::byte* send, std::span<const std::int64_t> send_counts,
                    std::span<const std::int64_t> send_offsets, std::byte* recv,
                    std::span<const std::int64_t> recv_counts, std::span<const std::int64_t> recv_offsets) override {
    STSA_CHECK(send_counts[0] == recv_counts[0], DistError, "alltoallv: rank 0 sends itself ", send_counts[0],
               " bytes but expects ", recv_counts[0]);
    if (send_counts[0] > 0) std::memmove(recv + recv_offsets[0], send + send_offsets[0], std::size_t(send_counts[0]));
  }
  void do_allgather(const void* mine, std::size_t bytes, void* all) override {
    if (bytes > 0) std::memmove(all, mine, bytes);
  }
  void do_allreduce(std::span<double>, ReduceOp) override {}
  void do_barrier() override {}
};

}  // namespace

Traffic Traffic::operator-(const Traffic& earlier) const {
  return {bytes_sent - earlier.bytes_sent,
          bytes_received - earlier.bytes_received,
          control_bytes_sent - earlier.control_bytes_sent,
          control_bytes_received - earlier.control_bytes_received,
          exchanges - earlier.exchanges,
          collectives - earlier.collectives};
}

Traffic& Traffic::operator+=(const Traffic& other) {
  bytes_sent += other.bytes_sent;
  bytes_received += other.bytes_received;
  control_bytes_sent += other.control_bytes_sent;
  control_bytes_received += other.control_bytes_received;
  exchanges += other.exchanges;
  collectives += other.collectives;
  return *this;
}

Communicator::Communicator() : timeout_(timeout_from_environment()) {}

void Communicator::set_timeout(std::chrono::milliseconds timeout) {
  STSA_CHECK(timeout.count() > 0, InvalidArgument, "communicator timeout must be positive, got ", timeout.count(),
             " ms");
  timeout_ = timeout;
}

void Communicator::alltoallv(const std::byte* send, std::span<const std::int64_t> send_counts,
                             std::span<const std::int64_t> send_offsets, std::byte* recv,
                             std::span<const std::int64_t> recv_counts, std::span<const std::int64_t> recv_offsets) {
  check_exchange_spans(size(), send_counts, send_offsets, "send");
  check_exchange_spans(size(), recv_counts, recv_offsets, "receive");
  do_alltoallv(send, send_counts, send_offsets, recv, recv_counts, recv_offsets);
  traffic_.bytes_sent += sum_except(send_counts, rank());
  traffic_.bytes_received += sum_except(recv_counts, rank());
  ++traffic_.exchanges;
  ++traffic_.collectives;
}

void Communicator::allgather(const void* mine, std::size_t bytes, void* all) {
  do_allgather(mine, bytes, all);
  traffic_.control_bytes_sent += std::int64_t(bytes) * (size() - 1);
  traffic_.control_bytes_received += std::int64_t(bytes) * (size() - 1);
  ++traffic_.collectives;
}

void Communicator::allreduce(std::span<double> values, ReduceOp op) {
  do_allreduce(values, op);
  // Counted as if every rank sent its array to every other rank (an upper bound of any algorithm).
  const std::int64_t bytes = std::int64_t(values.size_bytes()) * (size() - 1);
  traffic_.control_bytes_sent += bytes;
  traffic_.control_bytes_received += bytes;
  ++traffic_.collectives;
}

void Communicator::barrier() {
  do_barrier();
  ++traffic_.collectives;
}

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

bool built_with_mpi() {
#ifdef STSA_HAS_MPI
  return true;
#else
  return false;
#endif
}

bool built_with_nccl() {
#ifdef STSA_HAS_NCCL
  return true;
#else
  return false;
#endif
}

#ifndef STSA_HAS_MPI
MpiSession::MpiSession() {
  throw Unsupported("this build of stsa has no MPI support (configure with -DSTSA_MPI=ON and an MPI installed)");
}
MpiSession::~MpiSession() = default;
std::unique_ptr<Communicator> MpiSession::world() const {
  throw Unsupported("this build of stsa has no MPI support");
}
#endif

#ifndef STSA_HAS_NCCL
std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, int) {
  throw Unsupported("this build of stsa has no NCCL support (configure with -DSTSA_CUDA=ON, CUDA toolkit and NCCL)");
}
#endif

}  // namespace stsa::dist
