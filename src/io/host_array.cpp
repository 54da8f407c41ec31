#include "stsa/io.hpp"

namespace stsa::io {

std::int64_t HostArray::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

}  // namespace stsa::io
