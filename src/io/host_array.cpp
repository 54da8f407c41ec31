#include "stsa/error.hpp"
#include "stsa/io.hpp"

namespace stsa::io {

std::int64_t HostArray::numel() const {
  // The shape may be the caller's own: an unchecked product overflowed (UB) and could come out 0.
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    STSA_CHECK(d >= 0, InvalidArgument, "array dimension ", d, " is negative");
    STSA_CHECK(!__builtin_mul_overflow(n, d, &n), ResourceError, "array shape of ", shape.size(),
               " dimensions overflows 64-bit element counts");
  }
  return n;
}

}  // namespace stsa::io
