// cuda_gather_heads / cuda_scatter_heads make the checks of gather_heads /
// scatter_heads (permute.hpp), as cuda.hpp promises, and make them on the host
// before asking for a GPU: a malformed call is InvalidArgument on any machine,
// with or without a device (host tensors here: only a well-formed call gets as
// far as the device checks, which refuse host memory as Unsupported).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "stsa/error.hpp"
#include "stsa/permute.hpp"
#include "stsa/tensor.hpp"

#ifdef STSA_HAS_CUDA
#include "stsa/cuda.hpp"
#endif

namespace stsa {
namespace {

#ifdef STSA_HAS_CUDA

constexpr auto kFrom = TokenOrder::FrameMajor;
constexpr auto kTo = TokenOrder::SpatialMajor;

struct Shapes {
  VideoGrid grid{2, 3, 3, 0, TextPlacement::After};
  Tensor q{DType::BF16, 1, 18, 3, 16}, k{DType::BF16, 1, 18, 3, 16};
  Tensor packed_q{DType::BF16, 1, 18, 2, 16}, packed_k{DType::BF16, 1, 18, 2, 16};
  std::vector<std::int64_t> heads{2, 0};
};

template <class Call>
std::string invalid_message(Call&& call) {
  try {
    call();
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not InvalidArgument: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no exception";
  return {};
}

// One pair's destination over another pair's source: the CPU gather refuses it
// (a one-pass copy would read bytes it already wrote), and so does the GPU's.
TEST(CudaPermuteChecks, ADestinationOverAnotherPairsSourceIsInvalid) {
  Shapes s;
  const TensorView over_q =
      TensorView::contiguous(s.q.view().data, DType::BF16, 1, 18, 2, 16, MemoryLayout::BNHD);
  const std::vector<TensorView> sources{s.q.view(), s.k.view()}, packed{s.packed_q.view(), over_q};
  EXPECT_THROW(gather_heads(s.grid, kFrom, kTo, s.heads, sources, packed), InvalidArgument);
  const std::string what = invalid_message([&] { cuda_gather_heads(s.grid, kFrom, kTo, s.heads, sources, packed); });
  EXPECT_NE(what.find("overlaps"), std::string::npos) << what;
}

// A destination whose elements share addresses (token stride 0) would be
// written by many threads at once: refused, as on the CPU.
TEST(CudaPermuteChecks, ADestinationWithOverlappingStridesIsInvalid) {
  Shapes s;
  TensorView squashed = s.packed_q.view();
  squashed.stride[1] = 0;
  const std::vector<TensorView> sources{s.q.view()}, packed{squashed};
  EXPECT_THROW(gather_heads(s.grid, kFrom, kTo, s.heads, sources, packed), InvalidArgument);
  const std::string what = invalid_message([&] { cuda_gather_heads(s.grid, kFrom, kTo, s.heads, sources, packed); });
  EXPECT_NE(what.find("overlapping strides"), std::string::npos) << what;

  // The scatter's destination likewise, and its LSE destination.
  TensorView squashed_q = s.q.view();
  squashed_q.stride[1] = 0;
  const std::vector<TensorView> from{s.packed_q.view()}, dests{squashed_q};
  EXPECT_THROW(scatter_heads(s.grid, kTo, kFrom, s.heads, from, dests), InvalidArgument);
  EXPECT_THROW(cuda_scatter_heads(s.grid, kTo, kFrom, s.heads, from, dests), InvalidArgument);

  LseBuffer packed_lse(1, 2, 18), lse(1, 3, 18);
  LseView squashed_lse = lse.view();
  squashed_lse.stride[2] = 0;
  const std::vector<TensorView> good{s.q.view()};
  EXPECT_THROW(scatter_heads(s.grid, kTo, kFrom, s.heads, from, good, packed_lse.view(), squashed_lse),
               InvalidArgument);
  const std::string lse_what = invalid_message(
      [&] { cuda_scatter_heads(s.grid, kTo, kFrom, s.heads, from, good, packed_lse.view(), squashed_lse); });
  EXPECT_NE(lse_what.find("overlapping strides"), std::string::npos) << lse_what;
}

// A scatter's LSE rows move in the same pass as O's: an LSE destination over an
// O, or an O destination over the packed LSE, is refused, as on the CPU.
TEST(CudaPermuteChecks, AScatterLseOverTheTensorsIsInvalid) {
  Shapes s;
  const std::vector<TensorView> from{s.packed_q.view()}, dests{s.q.view()};
  LseBuffer packed_lse(1, 2, 18), lse(1, 3, 18);
  // [1, 3, 18] floats over the first 216 bytes of a bf16 tensor (1 x 18 x 3 x 16 = 1,728 bytes).
  const auto lse_over = [](const Tensor& t, std::int64_t heads) {
    return LseView::contiguous(static_cast<float*>(t.view().data), 1, heads, 18);
  };
  for (const auto& [from_lse, to_lse] : {std::pair{packed_lse.view(), lse_over(s.q, 3)},
                                         std::pair{packed_lse.view(), lse_over(s.packed_q, 3)},
                                         std::pair{lse_over(s.q, 2), lse.view()}}) {
    EXPECT_THROW(scatter_heads(s.grid, kTo, kFrom, s.heads, from, dests, from_lse, to_lse), InvalidArgument);
    const std::string what =
        invalid_message([&] { cuda_scatter_heads(s.grid, kTo, kFrom, s.heads, from, dests, from_lse, to_lse); });
    EXPECT_NE(what.find("overlaps"), std::string::npos) << what;
  }
  EXPECT_THROW(cuda_scatter_heads(s.grid, kTo, kFrom, s.heads, from, dests, packed_lse.view(), lse.view()),
               Unsupported);  // well formed: host memory, or no GPU
}

// Bad arguments are named as such with or without a GPU; a well-formed call on
// host tensors is Unsupported (host memory, or no GPU at all).
TEST(CudaPermuteChecks, MalformedCallsAreInvalidBeforeAnyGpuIsAskedFor) {
  Shapes s;
  const std::vector<TensorView> sources{s.q.view()}, packed{s.packed_q.view()};
  const std::vector<std::int64_t> twice{1, 1}, out_of_range{0, 3};
  EXPECT_THROW(cuda_scatter_heads(s.grid, kTo, kFrom, twice, packed, sources), InvalidArgument);
  // A gather may read a head twice (grouped K/V): well formed, so host memory or no GPU.
  EXPECT_THROW(cuda_gather_heads(s.grid, kFrom, kTo, twice, sources, packed), Unsupported);
  EXPECT_THROW(cuda_gather_heads(s.grid, kFrom, kTo, out_of_range, sources, packed), InvalidArgument);
  const std::vector<TensorView> fewer{s.q.view(), s.k.view()};
  EXPECT_THROW(cuda_gather_heads(s.grid, kFrom, kTo, s.heads, fewer, packed), InvalidArgument);
  LseBuffer packed_lse(1, 2, 18);
  EXPECT_THROW(cuda_scatter_heads(s.grid, kTo, kFrom, s.heads, packed, sources, packed_lse.view(), LseView{}),
               InvalidArgument);  // one LSE side only
  EXPECT_THROW(cuda_gather_heads(s.grid, kFrom, kTo, s.heads, sources, packed), Unsupported);
}

#else

TEST(CudaPermuteChecks, NeedsTheCudaBackend) { GTEST_SKIP() << "built without the CUDA backend"; }

#endif

}  // namespace
}  // namespace stsa
