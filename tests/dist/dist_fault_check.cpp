// Faults that must end a whole MPI job quickly, with a clear message and a
// non-zero exit code on every rank (run by check_run.sh under mpirun):
//   bad-input     the last rank passes a layout its tensors do not have -> every rank exits 2
//   heads         4 heads over a rank count that does not divide them   -> every rank exits 2
//   missing-rank  the last rank never calls (stuck) -> the others time out after 2 s and abort the job
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "dist_testing.hpp"

namespace {

using namespace stsa;
using namespace stsa::dist;

int run(Communicator& comm, const std::string& mode) {
  const int rank = comm.rank(), ranks = comm.size();
  VideoLayout l;
  l.grid = VideoGrid{2, 4, 4};
  l.heads = mode == "heads" ? 4 : 4 * ranks;
  l.head_dim = 64;
  const std::vector<MaskSpec> masks{MaskSpec::dense()};
  auto p = stsa::testing::make_problem(l, DType::F32, dist_testing::reference_heads(l, masks), 3);
  auto mine = dist_testing::shard_problem(p, masks, ranks, rank, true);
  if (mode == "bad-input" && rank == ranks - 1) mine.call.layout.head_dim = 80;
  if (mode == "missing-rank" && rank == ranks - 1) {
    std::this_thread::sleep_for(std::chrono::seconds(60));  // stuck: never joins the call
    return 0;
  }
  PlanCache plans;
  ulysses_attention(comm, mine.call, backend("reference"), plans);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "bad-input" && mode != "heads" && mode != "missing-rank") {
    std::fprintf(stderr, "usage: dist_fault_check bad-input|heads|missing-rank\n");
    return 2;
  }
  MpiSession mpi;
  auto comm = mpi.world();
  comm->set_timeout(std::chrono::seconds(2));
  try {
    return run(*comm, mode);
  } catch (const CommTimeout& e) {
    // The communicator is unusable and some rank is not responding: end the whole job.
    std::fprintf(stderr, "stsa: error: %s\n", e.what());
    std::fflush(stderr);
    comm->abort(3);
  } catch (const Error& e) {
    // Collective errors: every rank got the same one and can leave in order.
    std::fprintf(stderr, "stsa: error: rank %d: %s\n", comm->rank(), e.what());
    return 2;
  }
}
