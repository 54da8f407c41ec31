// Threads started for one piece of fork-join work, joined when it is done.
// std::thread throws when the system refuses a thread (a process or memory
// limit), and a vector of joinable threads destroyed by that exception ends the
// process (std::terminate). Here a refused thread is not an error: start() says
// false and the caller runs that share of the work itself (run_shares does).
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

// Calls share(s) for every s in [0, shares) and returns when all are done:
// shares 1, 2, ... on threads of their own while the system gives them, the rest
// and share 0 on the calling thread. `share` must not throw into the threads.
template <class Share>
void run_shares(int shares, const Share& share) {
  WorkerThreads workers(std::size_t(shares > 1 ? shares - 1 : 0));
  for (int s = 1; s < shares; ++s)
    if (!workers.start([&share, s] { share(s); })) break;
  for (int s = int(workers.size()) + 1; s < shares; ++s) share(s);
  share(0);
  workers.join();
}

}  // namespace stsa::detail
