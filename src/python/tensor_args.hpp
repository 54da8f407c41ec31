// Arrays from Python (any DLPack or buffer-protocol array: NumPy, PyTorch
// tensors on the CPU or a GPU, ml_dtypes' bfloat16) as the library's strided
// views, without copies.
#pragma once

#include <optional>

#include <nanobind/ndarray.h>

#include <cstdint>

#include "stsa/layout.hpp"
#include "stsa/tensor.hpp"

namespace stsa::python {

using InputArray = nanobind::ndarray<nanobind::ro>;  // read-only arrays are fine for q, k, v
using OutputArray = nanobind::ndarray<>;             // written: a read-only array is refused

// How the four axes of a Python array map to the library's logical [B, N, H, D].
enum class AxisOrder { BNHD, BHND };
AxisOrder parse_axis_order(std::string_view name);  // "bnhd" | "bhnd"

// Where an array's memory is: the host, or one CUDA device.
struct Placement {
  bool gpu = false;
  std::int32_t device = 0;  // the CUDA device, when gpu
  bool operator==(const Placement&) const = default;
};
// Throws Unsupported for memory that is neither (another DLPack device type).
template <class Array>
Placement placement_of(const Array& array, const char* name);

// A 4-D fp32, fp16, bf16 or fp8 (E4M3FN) array as a logical [B, N, H, D] view
// (strides in elements, as the array has them). `bits_of`: the array is an
// unsigned-integer view of that type's values, uint16 for bf16 and uint8 for fp8
// (what the Python layer passes for NumPy's ml_dtypes bfloat16 and
// float8_e4m3fn, which neither DLPack nor the buffer protocol carries).
// Throws InvalidArgument naming `name` for another rank or dtype.
template <class Array>
TensorView tensor_view(const Array& array, const char* name, AxisOrder axes, std::optional<DType> bits_of);

// K and V broadcast over the heads (head stride 0, as torch's expand and NumPy's broadcast_to
// make them) hold one head's values: that call is multi-query attention, which the library
// reads, uncopied, as grouped-query attention with one K/V head. Narrows both views to that
// head, after checking their head counts against q's `heads` as any K and V are (a count
// that q's does not divide is refused, broadcast or not). One of the two broadcast alone is
// refused, by name; any other broadcast is left to the library's check of overlapping strides.
void narrow_heads_broadcast(TensorView& k, TensorView& v, std::int64_t heads);

// A [B, H, N] fp32 array as an LSE view.
LseView lse_view(const OutputArray& array, const char* name);

}  // namespace stsa::python
