// CUDA_OK(expr): the standalone checks and benchmarks stop with the failing call, its place
// and CUDA's message (exit 2) when a CUDA runtime call fails. Harness code only: the FFI
// handlers return their errors to XLA instead.
#ifndef HISPARSE_FFI_TESTS_CUDA_OK_H_
#define HISPARSE_FFI_TESTS_CUDA_OK_H_

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CUDA_OK(expr)                                                                  \
  do {                                                                                 \
    const cudaError_t err_ = (expr);                                                   \
    if (err_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,               \
                   cudaGetErrorString(err_));                                          \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

#endif  // HISPARSE_FFI_TESTS_CUDA_OK_H_
