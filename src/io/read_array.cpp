#include <string_view>

#include "stsa/error.hpp"
#include "stsa/io.hpp"

namespace stsa::io {

HostArray read_array(const std::string& path, const std::string& tensor) {
  constexpr std::string_view kSafetensors = ".safetensors";
  const bool is_safetensors =
      path.size() >= kSafetensors.size() && path.compare(path.size() - kSafetensors.size(), kSafetensors.size(), kSafetensors) == 0;
  if (is_safetensors) return read_safetensors(path, tensor);
  STSA_CHECK(tensor.empty(), InvalidArgument, path, ": a tensor name ('", tensor,
             "') only applies to .safetensors files");
  return read_npy(path);
}

}  // namespace stsa::io
