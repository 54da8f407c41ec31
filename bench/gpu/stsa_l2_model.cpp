// stsa_l2_model: how much of the persistent sm90 kernel's K/V traffic the L2
// serves, per work order and block schedule, at one video shape (no GPU).
//
// Why it matters: at 1440p the kernel runs at the board's power cap, so DRAM
// traffic costs clock. ncu on the second GPU run (1440p, s = 0.2) read 46% L2
// hits and 1.43 GHz across heads, 81% and 1.54 GHz head by head, in nearly
// the same cycle count (bench/NOTES.md, "The clock, not the cycles").
//
// The model: every block walks its items (block_schedule.hpp) in simulated
// time, an item costing kItemOverheadTiles steps and then one step per kept key
// tile, each step reading that tile's K and V (64 KB at 128 x 128 bf16)
// through one LRU cache of --capacity-mb; steps take 1 +- --jitter (uniform,
// fixed seed) so blocks drift as real ones do. It ignores Q, O and plan reads
// (under 1% of the bytes at these shapes), the L2's sets and hashing, and
// prefetch. With 25 MB (one of the H200's two L2 partitions; the model read
// 78% at the profiled case, ncu 81%) it is a ranking tool: which schedule
// keeps the running blocks on one window of K/V.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <queue>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/block_schedule.hpp"
#include "cuda/device_plan_image.hpp"
#include "cuda/work_items.hpp"
#include "model_shape.hpp"
#include "stsa/error.hpp"

namespace {

using namespace stsa::cuda_detail;

// Least-recently-used set of tile ids, O(1) per access.
class LruCache {
 public:
  LruCache(int ids, int capacity) : prev_(ids, -1), next_(ids, -1), present_(ids, 0), capacity_(capacity) {}

  // Whether `id` was cached; it is the most recent afterwards.
  bool access(int id) {
    const bool hit = present_[id];
    if (hit) {
      unlink(id);
    } else {
      if (size_ == capacity_) {
        const int victim = tail_;
        unlink(victim);
        present_[victim] = 0;
        --size_;
      }
      present_[id] = 1;
      ++size_;
    }
    prev_[id] = -1;
    next_[id] = head_;
    if (head_ >= 0) prev_[head_] = id;
    head_ = id;
    if (tail_ < 0) tail_ = id;
    return hit;
  }

 private:
  void unlink(int id) {
    (prev_[id] >= 0 ? next_[prev_[id]] : head_) = next_[id];
    (next_[id] >= 0 ? prev_[next_[id]] : tail_) = prev_[id];
  }

  std::vector<int> prev_, next_;
  std::vector<char> present_;
  int head_ = -1, tail_ = -1, size_ = 0, capacity_;
};

// The device plan's lists, as the kernel reads them.
struct KeyLists {
  std::vector<std::int32_t> row_begin, key_tiles, q_tile_order, rank_costs;
  int q_tiles = 0;
};

KeyLists key_lists(const DevicePlanImage& image) {
  const auto array = [&](std::size_t offset, std::int64_t count) {
    std::vector<std::int32_t> out(static_cast<std::size_t>(count));
    std::memcpy(out.data(), image.bytes.data() + offset, out.size() * sizeof(std::int32_t));
    return out;
  };
  return {array(image.row_begin, image.q_tiles + 1), array(image.key_tiles, image.kept_tiles),
          array(image.q_tile_order, image.q_tiles), image.rank_costs, static_cast<int>(image.q_tiles)};
}

struct Traffic {
  std::int64_t reads = 0, hits = 0;
  double hit_rate() const { return reads ? double(hits) / double(reads) : 0.0; }
};

Traffic simulate(const KeyLists& lists, const BlockSchedule& schedule, int heads, WorkOrder order,
                 int capacity_tiles, double jitter) {
  LruCache cache(heads * lists.q_tiles, capacity_tiles);  // key tiles = query tiles (self-attention)
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> step(1.0 - jitter, 1.0 + jitter);
  struct Ready {
    double time;
    int block;
    bool operator>(const Ready& o) const { return time > o.time || (time == o.time && block > o.block); }
  };
  std::priority_queue<Ready, std::vector<Ready>, std::greater<>> ready;
  const int blocks = schedule.blocks();
  std::vector<int> item(blocks), key(blocks, -1);  // key < 0: the item's prologue comes next
  for (int b = 0; b < blocks; ++b) {
    item[b] = schedule.begin[b];
    if (item[b] < schedule.begin[b + 1]) ready.push({0.0, b});
  }
  Traffic traffic;
  while (!ready.empty()) {
    const auto [time, b] = ready.top();
    ready.pop();
    const WorkSlot slot = work_slot(schedule.items[item[b]], lists.q_tiles, 1, heads, order, schedule.heavy_ranks);
    const int q_tile = lists.q_tile_order[slot.rank];
    // After an item's last kept tile (at once for a row that keeps none), the
    // block's next item, if any, starts with its prologue.
    const auto next_item = [&] {
      key[b] = -1;
      return ++item[b] < schedule.begin[b + 1];
    };
    if (key[b] < 0) {
      key[b] = lists.row_begin[q_tile];
      if (key[b] == lists.row_begin[q_tile + 1] && !next_item()) continue;
      ready.push({time + double(kItemOverheadTiles) * step(rng), b});
      continue;
    }
    traffic.hits += cache.access(slot.head_slot * lists.q_tiles + lists.key_tiles[key[b]]);
    ++traffic.reads;
    if (++key[b] == lists.row_begin[q_tile + 1] && !next_item()) continue;
    ready.push({time + step(rng), b});
  }
  return traffic;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Models the L2 hit rate of the sm90 kernel's K/V reads per work order and block schedule (no GPU)."};
  stsa::bench_models::ModelShape shape;
  double capacity_mb = 25.0, jitter = 0.05;
  shape.add_options(app);
  app.add_option("--capacity-mb", capacity_mb, "cache size (MB of 64 KB K+V tile pairs)")->capture_default_str();
  app.add_option("--jitter", jitter, "each step takes 1 +- this (uniform)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    shape.grid();  // checks the sizes
    const int heads = shape.heads, blocks = shape.blocks;
    const int capacity_tiles = static_cast<int>(capacity_mb * 1024 * 1024 / (64 * 1024));
    STSA_CHECK(capacity_tiles >= 1, stsa::InvalidArgument, "--capacity-mb must hold one 64 KB tile pair");
    STSA_CHECK(jitter >= 0 && jitter < 1, stsa::InvalidArgument, "--jitter must be in [0, 1)");
    std::printf("%lldx%lldx%lld tokens, %d heads, %d blocks, %d tile pairs of cache (%.1f MB), jitter %.2f\n",
                static_cast<long long>(shape.frames), static_cast<long long>(shape.height),
                static_cast<long long>(shape.width), heads, blocks, capacity_tiles, capacity_mb, jitter);
    std::printf("density | K/V reads | L2 hits: across-heads round-robin | head-by-head round-robin | "
                "across-heads balanced | head-by-head balanced | head-by-head snake | heavy-first snake\n");
    for (const double density : shape.densities) {
      const KeyLists lists = key_lists(shape.plan_image(density));
      std::string cells;
      std::int64_t reads = 0;
      using Policy = stsa::CudaBlockSchedule;
      const std::pair<WorkOrder, Policy> cases[] = {
          {kWorkAcrossHeads, Policy::RoundRobin}, {kWorkHeadByHead, Policy::RoundRobin},
          {kWorkAcrossHeads, Policy::Balanced},   {kWorkHeadByHead, Policy::Balanced},
          {kWorkHeadByHead, Policy::Snake},       {kWorkHeavyFirst, Policy::Snake}};
      for (const auto& [order, policy] : cases) {
        const BlockSchedule schedule = make_block_schedule(lists.rank_costs, heads, blocks, order, policy);
        const Traffic traffic = simulate(lists, schedule, heads, order, capacity_tiles, jitter);
        reads = traffic.reads;
        char cell[32];
        std::snprintf(cell, sizeof cell, " | %.3f", traffic.hit_rate());
        cells += cell;
      }
      std::printf("%s | %lld%s\n", shape.label(density).c_str(), static_cast<long long>(reads), cells.c_str());
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stsa_l2_model: %s\n", e.what());
    return 2;
  }
  return 0;
}
