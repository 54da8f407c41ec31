// Reading and writing arrays: NumPy .npy and .safetensors (for Q/K/V dumped
// from a user's model). Every malformed, truncated or unsupported file gives
// IoError naming the file and the problem; nothing is read past the file's end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "stsa/dtype.hpp"

namespace stsa::io {

struct HostArray {
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;  // C order
  std::vector<std::byte> data;      // little-endian, contiguous
  std::int64_t numel() const;       // InvalidArgument for a negative dimension, ResourceError past 64 bits
};

// Parses a whole .npy file held in memory (`name` only labels errors): dtypes
// '<f4' (fp32), '<f2' (fp16), '<V2' / '|V2' (bfloat16 bits, as ml_dtypes saves
// them) and '<V1' / '|V1' (float8_e4m3fn bits, likewise; NumPy cannot tell that
// from other one-byte types, so .safetensors' F8_E4M3 is the unambiguous form);
// C order only (fortran_order True is rejected).
HostArray parse_npy(const std::byte* bytes, std::size_t size, const std::string& name = "<memory>");
HostArray read_npy(const std::string& path);
// Refuses to overwrite an existing file unless overwrite is true.
void write_npy(const std::string& path, const HostArray& array, bool overwrite = false);

std::vector<std::string> safetensors_names(const std::string& path);
// dtypes F32, BF16, F16, F8_E4M3; throws IoError naming the file and the tensor when absent or malformed,
// and for a header that lists a tensor twice or repeats a key inside an entry.
HostArray parse_safetensors(const std::byte* bytes, std::size_t size, const std::string& tensor,
                            const std::string& name = "<memory>");
HostArray read_safetensors(const std::string& path, const std::string& tensor);

// Reads `path` as .npy, or as .safetensors when the name ends in .safetensors (then `tensor` is required).
HostArray read_array(const std::string& path, const std::string& tensor = "");

}  // namespace stsa::io
