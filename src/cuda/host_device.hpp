// Arithmetic shared by kernels and host code (and host-tested): inline on the
// host, __host__ __device__ under nvcc.
#pragma once

#if defined(__CUDACC__)
#define STSA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define STSA_HOST_DEVICE inline
#endif
