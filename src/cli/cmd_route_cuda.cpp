// `stsa route --backend cuda`: the whole routed call on the GPU (cuda_route,
// then cuda_run_routed: the temporal heads gathered, every head's plan run, the
// temporal heads' O and LSE stored in place by the kernel) on device copies of
// the inputs. The output comes back to the host, where cmd_route.cpp evaluates
// it against fp64 dense attention as it does for the CPU backends.
#include <string>

#include "cli/commands.hpp"
#include "stsa/error.hpp"
#if defined(STSA_HAS_CUDA)
#include "cli/device_tensor.hpp"
#include "stsa/cuda.hpp"
#include "stsa/cuda_routing.hpp"
#endif

namespace stsa::cli {

#if defined(STSA_HAS_CUDA)

void require_cuda_device() {
  STSA_CHECK(cuda_device_count() > 0, Unsupported, "--backend cuda: no CUDA device (", cuda_unavailable_reason(), ")");
}

RoutedRun route_on_cuda(const Router& router, const RoutedCall& host, const RoutedOptions& options) {
  const VideoLayout& layout = host.layout;
  require_cuda_device();
  const LseView host_lse =
      LseView::contiguous(host.lse.data, layout.batch, layout.heads, layout.tokens());  // the device LSE's layout
  STSA_CHECK(host.lse.data == nullptr || host.lse.stride == host_lse.stride, InvalidArgument,
             "--backend cuda: the host LSE is not contiguous");
  const CudaDeviceInfo device = cuda_device_info();
  // q, k, v, o, LSE and the routed call's packed copies of q, k, v (every head
  // temporal at most), and of o and LSE when the scatter is a pass of its own;
  // the routing workspace is small beside them.
  const double lse_bytes = double(layout.batch * layout.heads * layout.tokens()) * sizeof(float);
  const double outputs = double(host_bytes(host.o)) + lse_bytes;
  const double bytes = 6.0 * double(host_bytes(host.q)) + (options.fuse_scatter ? 1.0 : 2.0) * outputs;
  STSA_CHECK(bytes < 0.8 * double(device.global_memory_bytes), ResourceError, "--backend cuda: the tensors need ",
             bytes / 1e9, " GB on the GPU, more than 80% of the ", double(device.global_memory_bytes) / 1e9,
             " GB of ", device.name);
  RoutedRun run;
  run.device = device.name;
  run.copy_gbps = cuda_measure_copy_gbps();  // before the tensors: its two buffers are freed again
  const DeviceTensor q = upload(host.q), k = upload(host.k), v = upload(host.v), o = empty_like(host.o);
  DeviceBuffer lse(std::size_t(layout.batch * layout.heads * layout.tokens()) * sizeof(float));
  lse.fill_bytes(0xFF);  // NaN, as the output
  RoutedCall call = host;
  call.q = q.view;
  call.k = k.view;
  call.v = v.view;
  call.o = o.view;
  call.lse = LseView::contiguous(static_cast<float*>(lse.data()), layout.batch, layout.heads, layout.tokens());

  // What the backend cannot run is refused before any routing.
  const CudaBackend backend;
  const Support support = backend.supports(call.unrouted_call());
  STSA_CHECK(support.ok, Unsupported, "--backend cuda: ", support.why);
  PlanCache plans;
  // Twice: the first call creates the scratch pool and uploads the plans (synchronous
  // copies inside its timed span); the second is what a serving loop's calls cost.
  for (int pass = 0; pass < 2; ++pass) {
    run.report = cuda_route(router, layout, call.q, call.k, call.v, TokenOrder::FrameMajor, call.softmax_scale);
    run.result = cuda_run_routed(backend, plans, call, run.report.heads, options);
  }
  run.result.routing_ms = run.report.routing_ms;
  run.result.routing_flops = run.report.flops;
  o.buffer.copy_to_host(host.o.data, host_bytes(host.o));
  if (host.lse.data != nullptr) lse.copy_to_host(host.lse.data, lse.bytes());
  return run;
}

#else

constexpr const char* kNoCudaBuild =
    "this stsa was built without the CUDA backend (nvcc not found at configure time, or -DSTSA_CUDA=OFF)";

void require_cuda_device() { throw Unsupported(kNoCudaBuild); }

RoutedRun route_on_cuda(const Router&, const RoutedCall&, const RoutedOptions&) { throw Unsupported(kNoCudaBuild); }

#endif

}  // namespace stsa::cli
