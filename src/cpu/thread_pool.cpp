#include "cpu/thread_pool.hpp"

namespace stsa::cpu {

ThreadPool::ThreadPool(int threads) : workers_(std::size_t(threads > 1 ? threads - 1 : 0)) {
  // Workers the system refuses leave a smaller pool: items are handed out to whoever is there.
  for (int w = 1; w < threads; ++w)
    if (!workers_.start([this, w] { worker_main(w); })) break;
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  workers_.join();
}

void ThreadPool::run_items(int worker) {
  while (!failed_.load(std::memory_order_relaxed)) {
    const std::int64_t item = next_.fetch_add(1, std::memory_order_relaxed);
    if (item >= count_) break;
    try {
      (*fn_)(item, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
}

void ThreadPool::worker_main(int worker) {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      if (!open_) continue;  // woke after the caller finished this loop alone
      ++active_;
    }
    run_items(worker);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --active_;
    }
    done_cv_.notify_one();
  }
}

void ThreadPool::parallel_for(std::int64_t count, const std::function<void(std::int64_t, int)>& fn) {
  if (count <= 0) return;
  if (workers_.size() == 0 || count == 1) {
    for (std::int64_t i = 0; i < count; ++i) fn(i, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    count_ = count;
    next_.store(0, std::memory_order_relaxed);
    failed_.store(false, std::memory_order_relaxed);
    error_ = nullptr;
    open_ = true;
    ++generation_;
  }
  start_cv_.notify_all();
  run_items(0);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    open_ = false;
    done_cv_.wait(lock, [&] { return active_ == 0; });
    fn_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace stsa::cpu
