// TMA tensor maps on the host: the driver's cuTensorMapEncodeTiled reached through the runtime's
// entry-point query, so the library links the CUDA runtime alone (no -lcuda). Used by kernels
// whose tensor copies (cp.async.bulk.tensor) take a map of an operand per launch
// (grouped_matmul_stream.cuh). Header only, host code only.
#ifndef HISPARSE_FFI_TENSOR_MAP_H_
#define HISPARSE_FFI_TENSOR_MAP_H_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>

namespace hisparse {

// A tiled map of a dense row-major tensor of `rank` (<= 5) dimensions, innermost first: dims[i]
// elements, strides[i] bytes between consecutive indices of dimension i + 1, boxes of box[i]
// elements, no interleave, no swizzle, out-of-bounds elements filled with zeros.
// cudaErrorNotSupported where the driver has no tensor maps, cudaErrorInvalidValue where it
// refuses the shape (the caller then takes another path).
inline cudaError_t EncodeTensorMap(CUtensorMap* map, CUtensorMapDataType type, int rank, const void* base,
                                   const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                   CUtensorMapL2promotion promotion) {
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static Encode encode = nullptr;
  static cudaError_t lookup = cudaErrorUnknown;
  static std::once_flag once;
  std::call_once(once, [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    lookup = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    if (lookup == cudaSuccess && (found != cudaDriverEntryPointSuccess || fn == nullptr)) lookup = cudaErrorNotSupported;
    if (lookup == cudaSuccess) encode = reinterpret_cast<Encode>(fn);
  });
  if (lookup != cudaSuccess) return cudaErrorNotSupported;
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  const CUresult r = encode(map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(base), dims, strides, box,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, promotion,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace hisparse

#endif  // HISPARSE_FFI_TENSOR_MAP_H_
