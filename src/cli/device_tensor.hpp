// Device copies of the CLI's host tensors (`stsa bench --backend cuda`, `stsa
// route --backend cuda`): same shape and strides, device pointer. Plain C++
// (stsa/cuda.hpp needs no CUDA header); used only where STSA_HAS_CUDA is set.
#pragma once

#include <cstddef>

#include "stsa/cuda.hpp"
#include "stsa/tensor.hpp"

namespace stsa::cli {

struct DeviceTensor {
  DeviceBuffer buffer;
  TensorView view;
};

inline std::size_t host_bytes(const TensorView& t) { return std::size_t(t.numel()) * element_size(t.dtype); }

inline DeviceTensor upload(const TensorView& host) {
  DeviceTensor d{DeviceBuffer(host_bytes(host)), host};
  d.buffer.copy_from_host(host.data, host_bytes(host));
  d.view.data = d.buffer.data();
  return d;
}

// Filled with 0xFF bytes (NaN): rows the kernel never writes show up in the check.
inline DeviceTensor empty_like(const TensorView& host) {
  DeviceTensor d{DeviceBuffer(host_bytes(host)), host};
  d.buffer.fill_bytes(0xFF);
  d.view.data = d.buffer.data();
  return d;
}

}  // namespace stsa::cli
