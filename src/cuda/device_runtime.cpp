// Device discovery, synchronisation, error translation and device buffers.
#include <cuda_runtime_api.h>

#include <string>

#include "cuda/barrier_timeout.hpp"
#include "cuda/cuda_check.hpp"
#include "stsa/cuda.hpp"
#include "stsa/error.hpp"

namespace stsa {
namespace cuda_detail {

void throw_cuda_error(cudaError_t status, const char* what, const char* file, int line) {
  cudaGetLastError();  // clear the slot so a later, unrelated check does not see this error again
  // A kernel that trapped on a barrier wait left a note on which barrier
  // (barrier_timeout.hpp); only a kernel fault can be that trap.
  const bool kernel_fault = status == cudaErrorLaunchFailure || status == cudaErrorIllegalInstruction ||
                            status == cudaErrorAssert;
  const std::string timeout = kernel_fault ? barrier_timeout_note() : std::string();
  const std::string message =
      detail::concat("CUDA error in ", what, " (", file, ":", line, "): ", cudaGetErrorName(status), ": ",
                     cudaGetErrorString(status), timeout.empty() ? "" : "; ", timeout);
  switch (status) {
    case cudaErrorMemoryAllocation: throw ResourceError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoKernelImageForDevice: throw Unsupported(message);
    default: throw Error(message);
  }
}

int current_device() {
  STSA_CHECK(cuda_device_count() > 0, Unsupported, "no CUDA device: ", cuda_unavailable_reason());
  int device = 0;
  STSA_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

}  // namespace cuda_detail

namespace {

// cudaGetDeviceCount's answer, asked once: without a driver it fails, which is
// the ordinary state of a build or CI machine, not an error.
struct DeviceCount {
  int count = 0;
  std::string reason;
};

const DeviceCount& device_count_once() {
  static const DeviceCount answer = [] {
    DeviceCount result;
    const cudaError_t status = cudaGetDeviceCount(&result.count);
    if (status != cudaSuccess) {
      cudaGetLastError();
      result.count = 0;
      result.reason = detail::concat(cudaGetErrorName(status), ": ", cudaGetErrorString(status));
    } else if (result.count == 0) {
      result.reason = "the CUDA runtime reports 0 devices";
    }
    return result;
  }();
  return answer;
}

}  // namespace

int cuda_device_count() { return device_count_once().count; }

std::string cuda_unavailable_reason() { return device_count_once().reason; }

CudaDeviceInfo cuda_device_info(int device) {
  // -1 alone means the current device: -2 is a mistake, not a synonym (checked before the GPU is asked for).
  STSA_CHECK(device >= -1, InvalidArgument, "CUDA device ", device, " does not exist (-1: the current one)");
  const int current = cuda_detail::current_device();
  if (device == -1) device = current;
  STSA_CHECK(device < cuda_device_count(), InvalidArgument, "CUDA device ", device, " does not exist (",
             cuda_device_count(), " present)");
  cudaDeviceProp props{};
  STSA_CUDA_CHECK(cudaGetDeviceProperties(&props, device));
  CudaDeviceInfo info;
  info.index = device;
  info.name = props.name;
  info.major = props.major;
  info.minor = props.minor;
  info.multiprocessors = props.multiProcessorCount;
  info.global_memory_bytes = std::int64_t(props.totalGlobalMem);
  info.l2_cache_bytes = props.l2CacheSize;
  info.shared_memory_per_block_optin = std::int64_t(props.sharedMemPerBlockOptin);
  int pools = 0;
  STSA_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device));
  info.memory_pools = pools != 0;
  STSA_CUDA_CHECK(cudaDriverGetVersion(&info.driver_version));
  STSA_CUDA_CHECK(cudaRuntimeGetVersion(&info.runtime_version));
  char bus_id[32] = {};
  STSA_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device));
  info.pci_bus_id = bus_id;
  return info;
}

void cuda_synchronize() {
  cuda_detail::current_device();
  STSA_CUDA_CHECK(cudaDeviceSynchronize());
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) {
  cuda_detail::current_device();
  if (bytes == 0) return;
  STSA_CUDA_CHECK(cudaMalloc(&data_, bytes));
  bytes_ = bytes;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) {
      cudaFree(data_);
      cudaGetLastError();
    }
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (!data_) return;
  cudaFree(data_);     // errors ignored: a destructor may run after the runtime shut down,
  cudaGetLastError();  // and cleared, so that they do not surface at a later launch check
}

void DeviceBuffer::copy_from_host(const void* src, std::size_t bytes, std::size_t offset) {
  STSA_CHECK(offset <= bytes_ && bytes <= bytes_ - offset, InvalidArgument, "copy of ", bytes, " bytes at offset ",
             offset, " exceeds the device buffer of ", bytes_, " bytes");
  if (bytes == 0) return;
  STSA_CUDA_CHECK(cudaMemcpy(static_cast<std::byte*>(data_) + offset, src, bytes, cudaMemcpyHostToDevice));
  // From pageable memory the copy may return before its DMA lands: synchronous
  // means landed, for launches on any stream.
  STSA_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

void DeviceBuffer::copy_to_host(void* dst, std::size_t bytes, std::size_t offset) const {
  STSA_CHECK(offset <= bytes_ && bytes <= bytes_ - offset, InvalidArgument, "copy of ", bytes, " bytes at offset ",
             offset, " exceeds the device buffer of ", bytes_, " bytes");
  if (bytes == 0) return;
  STSA_CUDA_CHECK(cudaMemcpy(dst, static_cast<const std::byte*>(data_) + offset, bytes, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::fill_bytes(unsigned char value) {
  if (bytes_ == 0) return;
  STSA_CUDA_CHECK(cudaMemset(data_, value, bytes_));
  STSA_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace stsa
