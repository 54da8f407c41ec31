// Threads the system refuses (a process or memory limit): the fork-join helpers,
// the CPU backend's pool and the router carry on with the threads they got, and
// give the same bits as with all of them, instead of ending the process
// (std::thread throws, and a vector of joinable threads destroyed by that
// exception calls std::terminate).
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "core/worker_threads.hpp"
#include "cpu/thread_pool.hpp"
#include "stsa/cpu.hpp"
#include "stsa/router.hpp"
#include "stsa/synth.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

TEST(WorkerThreads, StartsUpToItsRoomAndJoinsThemAll) {
  std::atomic<int> ran{0};
  {
    detail::WorkerThreads workers(3);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(workers.start([&ran] { ran.fetch_add(1); }));
    EXPECT_FALSE(workers.start([&ran] { ran.fetch_add(100); })) << "a fourth thread in room for three";
    EXPECT_EQ(workers.size(), 3u);
  }  // joined here
  EXPECT_EQ(ran.load(), 3);
}

// The rest runs in a child process whose address space is capped so that each
// new thread's stack (1 GiB there) fits `allowed` times, and small allocations
// still succeed: the threads after those are refused.
bool refuse_threads_after(int allowed) {
  pthread_attr_t attr;
  if (pthread_getattr_default_np(&attr) != 0) return false;
  const bool stack_set = pthread_attr_setstacksize(&attr, std::size_t(1) << 30) == 0 &&
                         pthread_setattr_default_np(&attr) == 0;
  pthread_attr_destroy(&attr);
  if (!stack_set) return false;
  std::ifstream statm("/proc/self/statm");
  long pages = 0;
  if (!(statm >> pages)) return false;
  const rlim_t cap = rlim_t(pages) * rlim_t(sysconf(_SC_PAGESIZE)) + rlim_t(allowed) * (rlim_t(1) << 30) +
                     (rlim_t(256) << 20);
  const rlimit limit{cap, cap};
  return setrlimit(RLIMIT_AS, &limit) == 0;
}

// Exits 0 when every check holds; otherwise says which failed on stderr and exits 1.
[[noreturn]] void run_with_threads_refused_after(int allowed) {
  // Inputs and the answers with one thread first, with no limit yet.
  const synth::Options o{.grid = {4, 12, 16, 5, TextPlacement::After}, .heads = 3, .head_dim = 64,
                         .dtype = DType::BF16, .seed = 11};
  const synth::Data data = synth::make_video_tokens(o);
  const auto route = [&](int threads) {
    RouterOptions ro;
    ro.samples = 16;
    ro.threads = threads;
    return Router(ro).route(data.layout, data.q.view(), data.k.view(), data.v.view());
  };
  const RoutingReport one = route(1);

  const VideoGrid& grid = data.layout.grid;
  const MaskSpec spec = mask_for_density(grid, SparseKind::Spatial, 0.3);
  const std::vector<HeadMask> heads(3, HeadMask{spec, spec.natural_order(), TilePlan::build(grid, spec, {64, 64}),
                                                true});
  auto single = testing::make_problem(data.layout, DType::BF16, heads, 5);
  auto pooled = testing::make_problem(data.layout, DType::BF16, heads, 5);
  make_cpu_backend({Isa::Auto, 1})->run(single.call());

  int failures = 0;
  const auto check = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "FAILED: %s\n", what);
      ++failures;
    }
  };
  if (!refuse_threads_after(allowed)) {
    std::fprintf(stderr, "could not cap the address space\n");
    std::_Exit(2);
  }
  {
    std::atomic<bool> go{false};
    detail::WorkerThreads probe(std::size_t(allowed) + 1);
    for (int i = 0; i < allowed; ++i)
      check(probe.start([&go] { while (!go.load()) std::this_thread::yield(); }), "an allowed thread was refused");
    check(!probe.start([] {}), "one thread more than allowed started (the test would prove nothing)");
    go = true;
  }

  const RoutingReport four = route(4);
  bool same = four.heads.size() == one.heads.size() && four.flops == one.flops;
  for (std::size_t h = 0; same && h < one.heads.size(); ++h) {
    same = four.heads[h].route == one.heads[h].route &&
           four.heads[h].candidates.size() == one.heads[h].candidates.size();
    for (std::size_t c = 0; same && c < one.heads[h].candidates.size(); ++c)
      same = four.heads[h].candidates[c].mse == one.heads[h].candidates[c].mse;
  }
  check(same, "the router with 4 threads asked and fewer started differs from 1 thread");

  std::vector<std::atomic<int>> shares(4);
  detail::run_shares(4, [&](int s) { shares[std::size_t(s)].fetch_add(1); });
  check(std::all_of(shares.begin(), shares.end(), [](const std::atomic<int>& n) { return n.load() == 1; }),
        "run_shares ran a share twice or not at all");

  {
    cpu::ThreadPool pool(4);
    check(pool.size() == 1 + allowed, "the pool reports threads it could not start");
    std::vector<std::atomic<int>> seen(1000);
    std::atomic<bool> bad_worker{false};
    pool.parallel_for(1000, [&](std::int64_t i, int worker) {
      seen[std::size_t(i)].fetch_add(1);
      if (worker < 0 || worker > allowed) bad_worker = true;
    });
    check(std::all_of(seen.begin(), seen.end(), [](const std::atomic<int>& s) { return s.load() == 1; }) &&
              !bad_worker.load(),
          "the pool ran an item twice, skipped one or named a worker it has not");
  }

  make_cpu_backend({Isa::Auto, 4})->run(pooled.call());
  const TensorView a = single.call().o, b = pooled.call().o;
  check(std::memcmp(a.data, b.data, std::size_t(a.numel()) * element_size(a.dtype)) == 0,
        "the CPU backend with 4 threads asked and fewer started differs from 1 thread");
  std::fflush(stderr);
  std::_Exit(failures == 0 ? 0 : 1);
}

TEST(WorkerThreads, RefusedThreadsLeaveTheWorkToTheCaller) {
  // (Their runtimes reserve terabytes of address space, which the cap would count.)
  if (testing::kSanitized) GTEST_SKIP() << "the address-space cap does not go with a sanitizer's runtime";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: no threads of earlier tests in the fork
  for (int allowed : {0, 1})  // none started, and one started before the next was refused
    EXPECT_EXIT(run_with_threads_refused_after(allowed), ::testing::ExitedWithCode(0), "^$") << allowed << " allowed";
}

}  // namespace
}  // namespace stsa
