// The CPU backend's thread pool, and that its output does not depend on the
// number of threads: every row is computed by one thread in a fixed order, so
// 1, 2, 3 or 8 threads must give the same bits. Also run under ThreadSanitizer
// (STSA_SANITIZE=thread), which is why the pool uses plain std::thread.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cpu/isa.hpp"
#include "cpu/thread_pool.hpp"
#include "stsa/cpu.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

TEST(CpuThreadPool, RunsEveryItemOnceOnValidWorkers) {
  for (int threads : {1, 2, 4, 8}) {
    cpu::ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (std::int64_t count : {0, 1, 7, 1000}) {
      std::vector<std::atomic<int>> seen(static_cast<std::size_t>(count));
      std::atomic<bool> bad_worker{false};
      pool.parallel_for(count, [&](std::int64_t i, int worker) {
        seen[std::size_t(i)].fetch_add(1);
        if (worker < 0 || worker >= threads) bad_worker = true;
      });
      for (const auto& s : seen) EXPECT_EQ(s.load(), 1);
      EXPECT_FALSE(bad_worker.load());
    }
  }
}

TEST(CpuThreadPool, RethrowsTheFirstErrorAndStaysUsable) {
  cpu::ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(100,
                                 [](std::int64_t i, int) {
                                   if (i == 17) throw std::runtime_error("item 17");
                                 }),
               std::runtime_error);
  std::atomic<std::int64_t> sum{0};
  pool.parallel_for(100, [&](std::int64_t i, int) { sum += i; });
  EXPECT_EQ(sum.load(), 4950);
}

std::vector<std::byte> bytes_of(const TensorView& t) {
  const auto* p = static_cast<const std::byte*>(t.data);
  return {p, p + t.numel() * std::int64_t(element_size(t.dtype))};
}

TEST(CpuThreads, OutputIsBitIdenticalForAnyThreadCount) {
  // Several heads of different masks and tile counts, a ragged last tile, text, two batches.
  const VideoGrid grid{5, 7, 9, 11, TextPlacement::Before};  // 326 tokens
  const VideoLayout layout{grid, 2, 4, 64};
  const TileShape tile{64, 64};
  auto head = [&](const MaskSpec& spec) {
    return HeadMask{spec, spec.natural_order(), TilePlan::build(grid, spec, tile), true};
  };
  const std::vector<HeadMask> heads{
      head(mask_for_density(grid, SparseKind::Spatial, 0.3)), head(mask_for_density(grid, SparseKind::Temporal, 0.1)),
      head(mask_for_density(grid, SparseKind::FrameWindow, 0.5)), head(MaskSpec::dense())};
  const std::uint64_t seed = testing::fresh_seed();
  // bf16 inputs take the bf16 dot product on AVX-512 and the tile products on AMX,
  // as do fp16 ones (in two parts) on AMX.
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx})
    for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::F8E4M3}) {
      if (!cpu::machine_supports(isa)) continue;
      SCOPED_TRACE(std::string(to_string(isa)) + " " + std::string(to_string(dtype)) + " seed " + std::to_string(seed));
      std::vector<std::byte> first_o;
      std::vector<float> first_lse;
      for (int threads : {1, 2, 3, 8}) {
        auto problem = testing::make_problem(layout, dtype, heads, seed);
        make_cpu_backend({isa, threads})->run(problem.call());
        const AttentionCall call = problem.call();
        std::vector<float> lse;
        for (std::int64_t b = 0; b < layout.batch; ++b)
          for (std::int64_t h = 0; h < layout.heads; ++h)
            for (std::int64_t n = 0; n < layout.tokens(); ++n) lse.push_back(call.lse.at(b, h, n));
        if (threads == 1) {
          first_o = bytes_of(call.o);
          first_lse = lse;
          const auto cmp = testing::compare_with_reference(problem, 64, seed);
          EXPECT_TRUE(cmp.ok()) << cmp.failure;
          continue;
        }
        EXPECT_TRUE(bytes_of(call.o) == first_o) << threads << " threads changed O";
        EXPECT_EQ(std::memcmp(lse.data(), first_lse.data(), lse.size() * sizeof(float)), 0)
            << threads << " threads changed LSE";
      }
    }
}

TEST(CpuThreads, OneBackendServesConcurrentCallers) {
  // run() is const and may be called from several threads; calls are serialised internally.
  const VideoGrid grid{2, 6, 6, 0, TextPlacement::After};
  const VideoLayout layout{grid, 1, 2, 64};
  const MaskSpec spec = mask_for_density(grid, SparseKind::Spatial, 0.4);
  const std::vector<HeadMask> heads(2,
                                    HeadMask{spec, spec.natural_order(), TilePlan::build(grid, spec, {64, 64}), true});
  const auto backend = make_cpu_backend({Isa::Auto, 2});
  std::vector<testing::Problem> problems;
  for (int i = 0; i < 3; ++i) problems.push_back(testing::make_problem(layout, DType::F32, heads, 100 + i));
  std::vector<std::thread> callers;
  for (auto& p : problems) callers.emplace_back([&] { backend->run(p.call()); });
  for (auto& t : callers) t.join();
  for (const auto& p : problems) {
    const auto cmp = testing::compare_with_reference(p);
    EXPECT_TRUE(cmp.ok()) << cmp.failure;
  }
}

}  // namespace
}  // namespace stsa
