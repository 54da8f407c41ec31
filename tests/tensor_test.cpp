// Owning tensors copy deep: a copy's view points at the copy's own bytes, so
// writing one never shows in the other (the GPU tests download two runs into
// two copies of one problem and compare them).
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "stsa/attention.hpp"
#include "stsa/error.hpp"
#include "stsa/tensor.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

TEST(Tensor, CopiesOwnTheirBytesAndKeepTheirLayout) {
  Tensor a(DType::BF16, 2, 5, 3, 8, MemoryLayout::BHND);
  a.view().store(1, 4, 2, 7, 1.5f);
  Tensor b = a;
  ASSERT_NE(b.view().data, a.view().data);
  EXPECT_EQ(b.view().stride, a.view().stride);
  EXPECT_EQ(b.view().load(1, 4, 2, 7), 1.5f);
  b.view().store(1, 4, 2, 7, -2.f);
  EXPECT_EQ(a.view().load(1, 4, 2, 7), 1.5f);
  Tensor c;
  c = b;
  ASSERT_NE(c.view().data, b.view().data);
  EXPECT_EQ(c.view().load(1, 4, 2, 7), -2.f);
  const void* before = c.view().data;
  Tensor d = std::move(c);  // a move keeps the buffer and leaves the source empty
  EXPECT_EQ(d.view().data, before);
  EXPECT_EQ(c.view().data, nullptr);  // NOLINT(bugprone-use-after-move): what a moved-from tensor holds
  Tensor e = c;  // a copy of an empty tensor is empty, not an alias of d
  EXPECT_EQ(e.view().data, nullptr);

  LseBuffer x(1, 2, 3);
  x.view().at(0, 1, 2) = 4.f;
  LseBuffer y = x;
  ASSERT_NE(y.view().data, x.view().data);
  y.view().at(0, 1, 2) = 5.f;
  EXPECT_EQ(x.view().at(0, 1, 2), 4.f);
}

// A file's bytes become a tensor without a copy, read in the layout's C order.
TEST(Tensor, TakesBytesInItsLayoutsOrderWithoutACopy) {
  for (MemoryLayout layout : {MemoryLayout::BNHD, MemoryLayout::BHND}) {
    std::vector<std::byte> bytes(2 * 3 * 4 * 5 * sizeof(float));
    for (std::size_t i = 0; i < bytes.size() / sizeof(float); ++i) {
      const float value = float(i);
      std::memcpy(bytes.data() + i * sizeof(float), &value, sizeof(float));
    }
    const void* buffer = bytes.data();
    const Tensor t(std::move(bytes), DType::F32, 2, 3, 4, 5, layout);  // B = 2, N = 3, H = 4, D = 5
    EXPECT_EQ(t.view().data, buffer);
    // Element (b, n, h, d) sits at C-order index of [B, N, H, D] or [B, H, N, D].
    const auto index = [&](int b, int n, int h, int d) {
      return layout == MemoryLayout::BNHD ? ((b * 3 + n) * 4 + h) * 5 + d : ((b * 4 + h) * 3 + n) * 5 + d;
    };
    for (int b = 0; b < 2; ++b)
      for (int n = 0; n < 3; ++n)
        for (int h = 0; h < 4; ++h)
          for (int d = 0; d < 5; ++d) ASSERT_EQ(t.view().load(b, n, h, d), float(index(b, n, h, d)));
  }
  EXPECT_THROW(Tensor(std::vector<std::byte>(119), DType::F32, 1, 2, 3, 5), InvalidArgument);
  EXPECT_THROW(Tensor(std::vector<std::byte>(120), DType::BF16, 1, 2, 3, 5), InvalidArgument);
  EXPECT_NO_THROW(Tensor(std::vector<std::byte>(60), DType::BF16, 1, 2, 3, 5));
}

TEST(Tensor, ACopiedProblemHasOutputsOfItsOwn) {
  const VideoLayout layout{{2, 3, 4, 0, TextPlacement::After}, 1, 2, 16};
  const testing::Problem p = testing::make_problem(layout, DType::F32, std::vector<HeadMask>(2), 1);
  testing::Problem a = p, b = p;
  ASSERT_NE(a.o.view().data, b.o.view().data);
  ASSERT_NE(a.lse.view().data, b.lse.view().data);
  ASSERT_NE(a.q.view().data, p.q.view().data);
  a.o.view().store(0, 1, 1, 3, 7.f);
  a.lse.view().at(0, 1, 5) = 3.f;
  EXPECT_NE(b.o.view().load(0, 1, 1, 3), 7.f);
  EXPECT_NE(b.lse.view().at(0, 1, 5), 3.f);
  EXPECT_TRUE(a.o.guards_intact() && b.o.guards_intact() && a.lse.guards_intact());
}

// Strides are the caller's: one that reaches past the address space must be a
// clear error from validation, not a signed overflow that wraps into a small,
// plausible byte range (which the aliasing checks would then trust).
TEST(Tensor, StridesReachingPastTheAddressSpaceAreRefused) {
  const VideoLayout layout{{2, 3, 4, 0, TextPlacement::After}, 2, 1, 16};
  Tensor owner(DType::BF16, 2, layout.tokens(), 1, 16);
  TensorView t = owner.view();
  ASSERT_NO_THROW(validate_tensor("q", t, layout));
  for (const std::int64_t stride : {std::int64_t(1) << 62, std::int64_t(3) << 61, std::numeric_limits<std::int64_t>::max()}) {
    t.stride[0] = stride;
    EXPECT_THROW(
        {
          try {
            validate_tensor("q", t, layout);
          } catch (const InvalidArgument& e) {
            EXPECT_NE(std::string(e.what()).find("address space"), std::string::npos) << e.what();
            EXPECT_EQ(std::string(e.what()).rfind("q: ", 0), 0u) << e.what();  // names the tensor, as other checks do
            throw;
          }
        },
        InvalidArgument)
        << stride;
    EXPECT_THROW(t.byte_extent(), InvalidArgument) << stride;
  }

  LseBuffer lse_owner(2, 1, layout.tokens());
  LseView lse = lse_owner.view();
  ASSERT_NO_THROW(validate_lse("lse", lse, layout));
  lse.stride[2] = std::int64_t(1) << 61;  // x 4 bytes x (N - 1) rows overflows
  try {
    validate_lse("lse", lse, layout);
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("lse: ", 0), 0u) << e.what();
  }
  lse = lse_owner.view();
  lse.data = reinterpret_cast<float*>(reinterpret_cast<std::byte*>(lse.data) + 2);
  EXPECT_THROW(validate_lse("lse", lse, layout), InvalidArgument);
  lse.data = nullptr;
  EXPECT_THROW(validate_lse("lse", lse, layout), InvalidArgument);
}

// The two memory layouts by definition: BNHD puts element (b, n, h, d) at
// ((b N + n) H + h) D + d, BHND at ((b H + h) N + n) D + d; the byte extent is
// exactly the B N H D elements, so a tensor ending where another begins does
// not overlap it and one element more does.
TEST(Tensor, ContiguousLayoutsAndExtentsFollowTheirDefinitions) {
  const std::int64_t B = 2, N = 5, H = 3, D = 4;
  for (const DType dtype : {DType::F32, DType::BF16}) {
    const auto elem = std::int64_t(element_size(dtype));
    std::vector<std::byte> storage(std::size_t(2 * B * N * H * D * elem));
    const TensorView bnhd = TensorView::contiguous(storage.data(), dtype, B, N, H, D, MemoryLayout::BNHD);
    const TensorView bhnd = TensorView::contiguous(storage.data(), dtype, B, N, H, D, MemoryLayout::BHND);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t d = 0; d < D; ++d) {
            EXPECT_EQ(bnhd.offset(b, n, h, d), ((b * N + n) * H + h) * D + d);
            EXPECT_EQ(bhnd.offset(b, n, h, d), ((b * H + h) * N + n) * D + d);
          }
    for (const TensorView& t : {bnhd, bhnd}) {
      const auto [first, last] = t.byte_extent();
      EXPECT_EQ(first, storage.data());
      EXPECT_EQ(last, storage.data() + B * N * H * D * elem);
      TensorView next = t;
      next.data = storage.data() + B * N * H * D * elem;
      EXPECT_FALSE(extents_overlap(t.byte_extent(), next.byte_extent()));
      next.data = storage.data() + (B * N * H * D - 1) * elem;
      EXPECT_TRUE(extents_overlap(t.byte_extent(), next.byte_extent()));
    }
  }
}

}  // namespace
}  // namespace stsa
