// Fuzzes the .npy parser: any byte string is parsed or rejected with stsa::IoError.
// Then HostArray::numel() of a shape drawn from the same bytes: the product, or (a planted
// defect) InvalidArgument for a negative dimension and ResourceError past 64 bits.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fuzz_finding.hpp"
#include "fuzz_reader.hpp"
#include "stsa/error.hpp"
#include "stsa/io.hpp"

namespace {

void require(bool ok, const char* what) { stsa::fuzz::require(ok, "npy_fuzz", what); }

struct Tally {
  long parsed = 0, counted = 0, negative = 0, overflow = 0;
  ~Tally() {
    std::fprintf(stderr,
                 "npy_fuzz: %ld files parsed; numel of %ld shapes, planted defects refused: %ld negative "
                 "dimensions, %ld past 64 bits\n",
                 parsed, counted, negative, overflow);
  }
} tally;

// numel() of `array` must throw Error; `refused` counts it.
template <class Error>
void require_refused(const stsa::io::HostArray& array, long& refused, const char* otherwise) {
  try {
    array.numel();
  } catch (const Error&) {
    ++refused;
    return;
  }
  require(false, otherwise);
}

// A shape of 1-5 dimensions; `plant` 1: one negative dimension among small ones, 2: a product past
// 2^63 - 1 with no zero dimension, 0: one that fits (a zero dimension, or small ones).
void check_numel(stsa::fuzz::Reader& in) {
  const std::int64_t plant = in.next(0, 5);
  const std::size_t rank = std::size_t(in.next(1, 5));
  stsa::io::HostArray array;
  if (plant == 1) {
    for (std::size_t i = 0; i < rank; ++i) array.shape.push_back(in.next(0, 200));
    array.shape[std::size_t(in.next(0, std::int64_t(rank) - 1))] = -in.next(1, 65535) * (in.next(0, 1) ? 1 : 1 << 20);
    return require_refused<stsa::InvalidArgument>(array, tally.negative,
                                                  "numel() of a negative dimension was not refused as InvalidArgument");
  }
  if (plant == 2) {
    array.shape.assign(std::max<std::size_t>(rank, 2), 1);
    // Two dimensions whose exponents add past 63; the rest from 1 up.
    const std::int64_t a = in.next(32, 62);
    array.shape[0] = (std::int64_t(1) << a) + in.next(0, 1000);
    array.shape[1] = (std::int64_t(1) << in.next(64 - a, 62)) + in.next(0, 1000);
    for (std::size_t i = 2; i < array.shape.size(); ++i) array.shape[i] = in.next(1, 9);
    return require_refused<stsa::ResourceError>(array, tally.overflow,
                                                "numel() past 64 bits was not refused as ResourceError");
  }
  __int128 product = 1;
  const bool zero = in.one_in(4);
  for (std::size_t i = 0; i < rank; ++i) {
    const std::int64_t d = zero && i == 0 ? 0 : in.next(0, 1) ? in.next(1, 64) : std::int64_t(1) << in.next(0, 62);
    array.shape.push_back(d);
    if (product <= __int128(INT64_MAX)) product *= d;  // once past, it stays past (d >= 1 after the first)
  }
  if (product > __int128(INT64_MAX)) return;  // not a valid shape then (planted ones are above)
  require(array.numel() == std::int64_t(product), "numel() is not the product of the shape");
  ++tally.counted;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto array = stsa::io::parse_npy(reinterpret_cast<const std::byte*>(data), size, "fuzz.npy");
    if (std::size_t(array.numel()) * stsa::element_size(array.dtype) != array.data.size()) __builtin_trap();
    ++tally.parsed;
  } catch (const stsa::IoError&) {
  }
  stsa::fuzz::Reader in(data, size, /*random_tail=*/true);
  check_numel(in);
  return 0;
}
