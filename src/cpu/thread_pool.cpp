#include "cpu/thread_pool.hpp"

#include <unistd.h>

namespace stsa::cpu {

std::atomic<ThreadPool::State*> ThreadPool::leaked_{nullptr};

ThreadPool::ThreadPool(int threads)
    : owner_(::getpid()), state_(std::make_unique<State>(std::size_t(threads > 1 ? threads - 1 : 0))) {
  // Workers the system refuses leave a smaller pool: items are handed out to whoever is there.
  State* state = state_.get();
  for (int w = 1; w < threads; ++w)
    if (!state->workers.start([state, w] { state->worker_main(w); })) break;
}

ThreadPool::~ThreadPool() {
  if (!owned_by_this_process()) {
    // Its workers live in the parent only: joining them, or destroying the condition
    // variables they wait on there, would block forever. Leave it all as it is.
    State* state = state_.release();
    state->next_leaked = leaked_.load();
    while (!leaked_.compare_exchange_weak(state->next_leaked, state)) {
    }
    return;
  }
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->start_cv.notify_all();
  state_->workers.join();
}

bool ThreadPool::owned_by_this_process() const { return ::getpid() == owner_; }

void ThreadPool::State::run_items(int worker) {
  while (!failed.load(std::memory_order_relaxed)) {
    const std::int64_t item = next.fetch_add(1, std::memory_order_relaxed);
    if (item >= count) break;
    try {
      (*fn)(item, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = std::current_exception();
      failed.store(true, std::memory_order_relaxed);
    }
  }
}

void ThreadPool::State::worker_main(int worker) {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      start_cv.wait(lock, [&] { return stopping || generation != seen; });
      if (stopping) return;
      seen = generation;
      if (!open) continue;  // woke after the caller finished this loop alone
      ++active;
    }
    run_items(worker);
    {
      std::lock_guard<std::mutex> lock(mutex);
      --active;
    }
    done_cv.notify_one();
  }
}

void ThreadPool::parallel_for(std::int64_t count, const std::function<void(std::int64_t, int)>& fn) {
  if (count <= 0) return;
  State& s = *state_;
  // In a forked child the workers are missing and the mutex may have been copied
  // locked: the caller runs every item without touching either.
  if (s.workers.size() == 0 || count == 1 || !owned_by_this_process()) {
    for (std::int64_t i = 0; i < count; ++i) fn(i, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.fn = &fn;
    s.count = count;
    s.next.store(0, std::memory_order_relaxed);
    s.failed.store(false, std::memory_order_relaxed);
    s.error = nullptr;
    s.open = true;
    ++s.generation;
  }
  s.start_cv.notify_all();
  s.run_items(0);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(s.mutex);
    s.open = false;
    s.done_cv.wait(lock, [&] { return s.active == 0; });
    s.fn = nullptr;
    error = s.error;
    s.error = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace stsa::cpu
