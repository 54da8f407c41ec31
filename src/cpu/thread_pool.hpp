// A small fixed pool of std::threads that runs loops of independent work items.
// Items are handed out one at a time in increasing order (dynamic scheduling),
// so callers that want the longest items first sort them before. Plain
// std::thread, mutex and atomics keep it checkable by ThreadSanitizer.
//
// fork(): a child process has none of the parent's workers, and joining them or
// destroying the condition variables they wait on would block forever. In a
// child a pool runs every loop on the calling thread, and its destructor leaves
// the shared state alone (a one-time leak); owners rebuild it there
// (owned_by_this_process()) to get their threads back.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/worker_threads.hpp"

namespace stsa::cpu {

class ThreadPool {
 public:
  // `threads` workers in all, the calling thread included (so threads - 1 are
  // started; fewer where the system refuses some: size() says how many run).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // 1 in a process forked from the one that built the pool (its workers are not there).
  int size() const { return owned_by_this_process() ? int(state_->workers.size()) + 1 : 1; }

  // Whether this process built the pool (false in a forked child).
  bool owned_by_this_process() const;

  // Calls fn(item, worker) for every item in [0, count), worker in [0, size()).
  // Blocks until all are done; if any call throws, no new items start and the
  // first exception is rethrown here. One loop at a time (callers serialise).
  void parallel_for(std::int64_t count, const std::function<void(std::int64_t, int)>& fn);

 private:
  struct State {
    explicit State(std::size_t most) : workers(most) {}
    void worker_main(int worker);
    void run_items(int worker);

    detail::WorkerThreads workers;
    std::mutex mutex;
    std::condition_variable start_cv;
    std::condition_variable done_cv;
    // Guarded by mutex. A worker joins a loop only while it is open; the caller
    // closes it once the items run out and waits for the workers that joined, so
    // a worker the OS wakes late never delays the caller.
    std::uint64_t generation = 0;  // bumped per loop
    bool open = false;
    int active = 0;                // workers inside the current loop
    bool stopping = false;
    const std::function<void(std::int64_t, int)>* fn = nullptr;  // set under mutex before a loop starts
    std::int64_t count = 0;
    std::atomic<std::int64_t> next{0};
    std::atomic<bool> failed{false};
    std::exception_ptr error;  // guarded by mutex
    State* next_leaked = nullptr;  // the list of states left to forked children (thread_pool.cpp)
  };

  // The states of pools destroyed in a forked child: never freed, but kept reachable
  // here so that a leak checker (ASan's, at exit) does not report them.
  static std::atomic<State*> leaked_;

  pid_t owner_;  // getpid() when built
  std::unique_ptr<State> state_;
};

}  // namespace stsa::cpu
