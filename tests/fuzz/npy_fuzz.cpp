// Fuzzes the .npy parser: any byte string is parsed or rejected with stsa::IoError.
#include <cstddef>
#include <cstdint>

#include "stsa/error.hpp"
#include "stsa/io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto array = stsa::io::parse_npy(reinterpret_cast<const std::byte*>(data), size, "fuzz.npy");
    std::int64_t numel = 1;
    for (auto d : array.shape) numel *= d;
    if (std::size_t(numel) * stsa::element_size(array.dtype) != array.data.size()) __builtin_trap();
  } catch (const stsa::IoError&) {
  }
  return 0;
}
