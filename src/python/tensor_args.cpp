#include "tensor_args.hpp"

#include "stsa/attention.hpp"
#include "stsa/error.hpp"

namespace nb = nanobind;

namespace stsa::python {
namespace {

DType element_type(const nb::dlpack::dtype& t, const char* name, std::optional<DType> bits_of = std::nullopt) {
  using Code = nb::dlpack::dtype_code;
  if (bits_of) {
    const auto bits = std::uint8_t(8 * element_size(*bits_of));
    STSA_CHECK(*bits_of != DType::F32 && t.lanes == 1 && t.code == std::uint8_t(Code::UInt) && t.bits == bits,
               InvalidArgument, name, ": a view of ", to_string(*bits_of), " values must be uint", int(bits));
    return *bits_of;
  }
  if (t.lanes == 1 && t.code == std::uint8_t(Code::Float) && t.bits == 32) return DType::F32;
  if (t.lanes == 1 && t.code == std::uint8_t(Code::Float) && t.bits == 16) return DType::F16;
  if (t.lanes == 1 && t.code == std::uint8_t(Code::Bfloat) && t.bits == 16) return DType::BF16;
  if (t.lanes == 1 && t.code == std::uint8_t(Code::Float8_E4M3FN) && t.bits == 8) return DType::F8E4M3;
  throw InvalidArgument(detail::concat(name, " must be float32, float16, bfloat16 or float8_e4m3fn (DLPack type code ",
                                       int(t.code), ", ", int(t.bits), " bits, ", int(t.lanes), " lanes given)"));
}

}  // namespace

template <class Array>
Placement placement_of(const Array& array, const char* name) {
  if (array.device_type() == nb::device::cpu::value) return {};
  STSA_CHECK(array.device_type() == nb::device::cuda::value, Unsupported, name, " is in memory of DLPack device type ",
             array.device_type(), ": stsa takes host (CPU) and CUDA arrays");
  return {true, array.device_id()};
}

template Placement placement_of(const InputArray&, const char*);
template Placement placement_of(const OutputArray&, const char*);

AxisOrder parse_axis_order(std::string_view name) {
  if (name == "bnhd") return AxisOrder::BNHD;
  if (name == "bhnd") return AxisOrder::BHND;
  throw InvalidArgument(detail::concat("layout must be 'bnhd' or 'bhnd', got '", name, "'"));
}

template <class Array>
TensorView tensor_view(const Array& array, const char* name, AxisOrder axes, std::optional<DType> bits_of) {
  STSA_CHECK(array.ndim() == 4, InvalidArgument, name, " must have 4 dimensions (",
             axes == AxisOrder::BNHD ? "[B, N, H, D]" : "[B, H, N, D]", "), got ", array.ndim());
  TensorView view;
  view.data = const_cast<void*>(static_cast<const void*>(array.data()));
  view.dtype = element_type(array.dtype(), name, bits_of);
  for (int axis = 0; axis < 4; ++axis) {
    view.shape[std::size_t(axis)] = std::int64_t(array.shape(std::size_t(axis)));
    view.stride[std::size_t(axis)] = std::int64_t(array.stride(std::size_t(axis)));
  }
  if (axes == AxisOrder::BHND) {
    std::swap(view.shape[1], view.shape[2]);
    std::swap(view.stride[1], view.stride[2]);
  }
  return view;
}

template TensorView tensor_view(const InputArray&, const char*, AxisOrder, std::optional<DType>);
template TensorView tensor_view(const OutputArray&, const char*, AxisOrder, std::optional<DType>);

void narrow_heads_broadcast(TensorView& k, TensorView& v, std::int64_t heads) {
  const auto broadcast = [](const TensorView& t) { return t.shape[2] > 1 && t.stride[2] == 0; };
  if (!broadcast(k) && !broadcast(v)) return;
  STSA_CHECK(broadcast(k) && broadcast(v), InvalidArgument, broadcast(k) ? "k" : "v",
             " is broadcast over the heads (stride 0) and ", broadcast(k) ? "v" : "k",
             " is not: broadcast both (multi-query attention) or neither");
  check_kv_head_counts("", k.heads(), v.heads(), heads);
  k.shape[2] = v.shape[2] = 1;
}

LseView lse_view(const OutputArray& array, const char* name) {
  STSA_CHECK(array.ndim() == 3, InvalidArgument, name, " must have 3 dimensions [B, H, N], got ", array.ndim());
  const nb::dlpack::dtype t = array.dtype();
  STSA_CHECK(t.lanes == 1 && t.code == std::uint8_t(nb::dlpack::dtype_code::Float) && t.bits == 32, InvalidArgument,
             name, " must be float32 (DLPack type code ", int(t.code), ", ", int(t.bits), " bits, ", int(t.lanes),
             " lanes given)");
  LseView view;
  view.data = static_cast<float*>(array.data());
  for (int axis = 0; axis < 3; ++axis) {
    view.shape[std::size_t(axis)] = std::int64_t(array.shape(std::size_t(axis)));
    view.stride[std::size_t(axis)] = std::int64_t(array.stride(std::size_t(axis)));
  }
  return view;
}

}  // namespace stsa::python
