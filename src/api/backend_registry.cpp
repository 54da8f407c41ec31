#include <memory>

#include "stsa/attention.hpp"
#include "stsa/cpu.hpp"
#include "stsa/error.hpp"
#include "stsa/reference.hpp"
#ifdef STSA_HAS_CUDA
#include "stsa/cuda.hpp"
#endif

namespace stsa {
namespace {

// Listed explicitly (no static self-registration, which a static library may drop).
const std::vector<std::unique_ptr<Backend>>& registry() {
  static const auto list = [] {
    std::vector<std::unique_ptr<Backend>> backends;
    backends.push_back(make_reference_backend());
    backends.push_back(make_cpu_backend());
#ifdef STSA_HAS_CUDA
    backends.push_back(make_cuda_backend());
#endif
    return backends;
  }();
  return list;
}

}  // namespace

std::vector<const Backend*> backends() {
  std::vector<const Backend*> out;
  for (const auto& b : registry()) out.push_back(b.get());
  return out;
}

const Backend& backend(std::string_view name) {
  std::string known;
  for (const auto& b : registry()) {
    if (b->name() == name) return *b;
    known += (known.empty() ? "" : ", ") + std::string(b->name());
  }
  throw InvalidArgument(detail::concat("unknown backend '", name, "' (available: ", known, ")"));
}

}  // namespace stsa
