// XLA FFI handler of TOP-K for platform "CUDA": check, then enqueue the
// kernel of topk_kernels.cu. The kernel's scratch is the call's second
// output (XLA allocates it), and the handler only enqueues work on XLA's
// stream, so it is marked kCmdBufferCompatible.
#include <cuda_runtime_api.h>

#include <string>

#include "common_cuda.h"
#include "common_handlers_cuda.h"
#include "topk.h"
#include "topk_checks.h"
#include "topk_cuda.h"

namespace hisparse {
namespace {

ffi::Error TopkCudaImpl(cudaStream_t stream, ffi::AnyBuffer scores, ffi::AnyBuffer sealed,
                        ffi::Result<ffi::AnyBuffer> selected,
                        ffi::Result<ffi::AnyBuffer> workspace, int64_t k) {
  constexpr const char* op = "hisparse_topk";
  auto dims = CheckTopk(scores, sealed, selected, workspace, k);
  if (dims.has_error()) return dims.error();
  if (dims->records > kTopkMaxRecords)
    return ffi::Error::InvalidArgument(std::string(op) + ": scores R = " +
                                       std::to_string(dims->records) +
                                       " exceeds the CUDA kernel's limit of " +
                                       std::to_string(kTopkMaxRecords));
  const char* failed_kernel = "hisparse topk kernel";
  const cudaError_t err =
      LaunchTopk(*dims, TopkIo(scores, sealed, selected),
                 static_cast<uint32_t*>(workspace->untyped_data()), stream, {}, &failed_kernel);
  return LaunchResult(op, failed_kernel, err);
}

}  // namespace
}  // namespace hisparse

HISPARSE_DEFINE_CUDA_HANDLER(HisparseTopkCuda, hisparse::TopkCudaImpl, hisparse::BindTopkOperands);
