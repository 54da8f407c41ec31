// Minimal fork-join loops for the router's bandwidth- and compute-parallel passes.
// Threads are started per call: these passes are long enough (milliseconds)
// that a pool would not pay for itself, and the router stays free of global state.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <vector>

#include "core/worker_threads.hpp"

namespace stsa::router_detail {

// Calls body(begin, end) on `threads` disjoint chunks of [0, count); rethrows the first exception.
// The caller takes the first chunk, and any chunk whose thread the system refused.
template <class Body>
void parallel_for(std::int64_t count, int threads, const Body& body) {
  if (count <= 0) return;
  threads = int(std::clamp<std::int64_t>(threads, 1, count));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));
  const std::int64_t chunk = (count + threads - 1) / threads;
  const auto run_chunk = [&](int t) {
    const std::int64_t begin = std::min(count, t * chunk), end = std::min(count, begin + chunk);
    try {
      body(begin, end);
    } catch (...) {
      errors[std::size_t(t)] = std::current_exception();
    }
  };
  detail::run_shares(threads, run_chunk);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Calls body(item, worker) for every item of [0, count), handed out one at a time
// (items may differ in cost), worker in [0, threads). Results must not depend on
// which worker ran an item: callers write per-item outputs and reduce them in item
// order. Stops handing out items after an exception and rethrows the first one.
// Workers whose threads the system refused leave their items to the others.
template <class Body>
void parallel_items(std::int64_t count, int threads, const Body& body) {
  if (count <= 0) return;
  threads = int(std::clamp<std::int64_t>(threads, 1, count));
  std::atomic<std::int64_t> next{0};
  std::atomic<bool> failed{false};
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));
  auto run = [&](int worker) {
    try {
      for (std::int64_t i = next++; i < count && !failed.load(); i = next++) body(i, worker);
    } catch (...) {
      errors[std::size_t(worker)] = std::current_exception();
      failed = true;
    }
  };
  detail::run_shares(threads, run);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace stsa::router_detail
