// A small fixed pool of std::threads that runs loops of independent work items.
// Items are handed out one at a time in increasing order (dynamic scheduling),
// so callers that want the longest items first sort them before. Plain
// std::thread, mutex and atomics keep it checkable by ThreadSanitizer.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
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

  int size() const { return int(workers_.size()) + 1; }

  // Calls fn(item, worker) for every item in [0, count), worker in [0, size()).
  // Blocks until all are done; if any call throws, no new items start and the
  // first exception is rethrown here. One loop at a time (callers serialise).
  void parallel_for(std::int64_t count, const std::function<void(std::int64_t, int)>& fn);

 private:
  void worker_main(int worker);
  void run_items(int worker);

  detail::WorkerThreads workers_;
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  // Guarded by mutex_. A worker joins a loop only while it is open; the caller
  // closes it once the items run out and waits for the workers that joined, so
  // a worker the OS wakes late never delays the caller.
  std::uint64_t generation_ = 0;  // bumped per loop
  bool open_ = false;
  int active_ = 0;                // workers inside the current loop
  bool stopping_ = false;
  const std::function<void(std::int64_t, int)>* fn_ = nullptr;  // set under mutex_ before a loop starts
  std::int64_t count_ = 0;
  std::atomic<std::int64_t> next_{0};
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;  // guarded by mutex_
};

}  // namespace stsa::cpu
