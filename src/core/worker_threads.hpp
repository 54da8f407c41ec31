// Threads started for one piece of fork-join work, joined when it is done.
// std::thread throws when the system refuses a thread (a process or memory
// limit), and a vector of joinable threads destroyed by that exception ends the
// process (std::terminate). Here a refused thread is not an error: start() says
// false and the caller runs that share of the work itself.
#pragma once

#include <cstddef>
#include <thread>
#include <vector>

namespace stsa::detail {

class WorkerThreads {
 public:
  // Room for `most` threads, reserved up front so that no start() reallocates.
  explicit WorkerThreads(std::size_t most) { threads_.reserve(most); }
  ~WorkerThreads() { join(); }
  WorkerThreads(const WorkerThreads&) = delete;
  WorkerThreads& operator=(const WorkerThreads&) = delete;

  // Runs a copy of `work` on a new thread; false, with nothing started, when the
  // system refuses one or `most` are running already.
  template <class Work>
  bool start(const Work& work) noexcept {
    if (threads_.size() == threads_.capacity()) return false;
    try {
      threads_.emplace_back(work);
      return true;
    } catch (...) {
      return false;
    }
  }

  std::size_t size() const { return threads_.size(); }

  void join() noexcept {
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  std::vector<std::thread> threads_;
};

}  // namespace stsa::detail
