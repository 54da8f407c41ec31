// A process forked after the CPU backend ran: the child has none of the parent's
// pool threads, and once hung forever where the pool was destroyed (a thread-count
// change, or the registry's backend at exit) and ran every call on one thread.
// (Kept out of the "threads" label: fork() with threads running is outside what
// ThreadSanitizer checks.)
#include <gtest/gtest.h>
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "cpu/thread_pool.hpp"
#include "stsa/cpu.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

// The threads this process runs now (Linux: one entry per thread in /proc/self/task).
int running_threads() {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int count = 0;
  while (const dirent* entry = ::readdir(dir))
    if (entry->d_name[0] != '.') ++count;
  ::closedir(dir);
  return count;
}

std::vector<float> output_of(const testing::Problem& p) {
  const TensorView o = p.o.view();
  std::vector<float> out;
  for (std::int64_t n = 0; n < p.layout.tokens(); ++n)
    for (std::int64_t h = 0; h < p.layout.heads; ++h)
      for (std::int64_t d = 0; d < p.layout.head_dim; ++d) out.push_back(o.load(0, n, h, d));
  return out;
}

// The child's exit statuses.
enum ChildStatus { kOk = 0, kDifferent = 1, kOneThread = 2, kDifferentAfterChange = 3, kThrew = 4 };

// The child's part: runs on the inherited backend, checks it runs threads of its
// own and gives the parent's bits, changes the thread count (the pool is rebuilt),
// runs again, and leaves through exit() (the registry's backend is destroyed).
[[noreturn]] void child(testing::Problem& p, const std::vector<float>& expected) {
  int status = kOk;
  try {
    p.o.poison();
    backend("cpu").run(p.call());
    if (output_of(p) != expected) status = kDifferent;
    else if (running_threads() < 2) status = kOneThread;  // the pool's worker is not there
    if (status == kOk) {
      set_cpu_defaults({Isa::Auto, 3});
      p.o.poison();
      backend("cpu").run(p.call());
      if (output_of(p) != expected) status = kDifferentAfterChange;
    }
  } catch (...) {
    status = kThrew;
  }
  std::exit(status);
}

// Waits up to 20 s for `pid` to exit; a child that hangs is killed and fails the test.
void expect_child_exits_ok(pid_t pid, const char* statuses) {
  int status = 0;
  pid_t done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    ADD_FAILURE() << "the forked child hung (killed after 20 s)";
    return;
  }
  ASSERT_EQ(done, pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << statuses;
}

// The pool on its own: in a child it runs every item on the caller and is destroyed
// without waiting for the parent's workers; a pool built there has threads again.
TEST(ForkSafety, APoolInheritedThroughForkRunsAloneAndIsLeftBehind) {
  auto pool = std::make_unique<cpu::ThreadPool>(3);
  ASSERT_EQ(pool->size(), 3);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    int status = 0;
    if (pool->owned_by_this_process() || pool->size() != 1) status = 1;
    std::vector<int> runs(100, 0);
    pool->parallel_for(100, [&](std::int64_t i, int worker) { runs[std::size_t(i)] += worker == 0 ? 1 : 100; });
    if (runs != std::vector<int>(100, 1)) status = 2;
    pool.reset();  // once waited forever for the parent's workers
    cpu::ThreadPool fresh(3);
    if (fresh.size() != 3) status = 3;
    std::_Exit(status);
  }
  expect_child_exits_ok(pid, "1: the child's pool says it owns its workers, 2: not every item once on the caller, "
                             "3: a new pool has no threads");
  EXPECT_TRUE(pool->owned_by_this_process());
  std::atomic<int> ran{0};
  pool->parallel_for(100, [&](std::int64_t, int) { ran.fetch_add(1); });
  EXPECT_EQ(ran.load(), 100);
}

TEST(ForkSafety, AForkedChildRunsChangesThreadsAndExits) {
  const CpuOptions saved = cpu_defaults();
  set_cpu_defaults({Isa::Auto, 2});
  const VideoGrid grid{2, 8, 8, 0, TextPlacement::After};
  const MaskSpec dense = MaskSpec::dense();
  const HeadMask head{dense, dense.natural_order(), TilePlan::build(grid, dense), true};
  testing::Problem p = testing::make_problem({grid, 1, 2, 64}, DType::F32, std::vector<HeadMask>(2, head), 3);
  backend("cpu").run(p.call());  // the registry's backend starts its pool here
  const std::vector<float> expected = output_of(p);

  std::fflush(nullptr);  // nothing buffered here is written twice
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) child(p, expected);

  expect_child_exits_ok(pid, "1: different output, 2: ran on one thread, 3: different output after the "
                             "thread-count change, 4: threw");

  // The parent's backend is as it was.
  p.o.poison();
  backend("cpu").run(p.call());
  EXPECT_EQ(output_of(p), expected);
  set_cpu_defaults(saved);
}

}  // namespace
}  // namespace stsa
