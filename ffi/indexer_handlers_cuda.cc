// XLA FFI handler of "hisparse_index_scores" for platform "CUDA": check the
// operands, then enqueue the kernel of indexer_kernels.cu. It only enqueues
// work on XLA's stream (lengths stay on the device, read by the kernel), so it
// is marked kCmdBufferCompatible. There is no CPU handler: on CPU the op runs
// its XLA reference (hisparse_jax/indexer.py).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "common.h"
#include "common_cuda.h"
#include "common_handlers_cuda.h"
#include "indexer.h"
#include "indexer_checks.h"
#include "indexer_cuda.h"

namespace hisparse {
namespace {

ffi::Error IndexScoresCudaImpl(cudaStream_t stream, ffi::AnyBuffer query, ffi::AnyBuffer weights,
                               ffi::AnyBuffer keys, ffi::AnyBuffer key_scale, ffi::AnyBuffer lengths,
                               ffi::Result<ffi::AnyBuffer> scores) {
  auto dims = CheckIndexScores(query, weights, keys, key_scale, lengths, scores->element_type(),
                               scores->dimensions());
  if (dims.has_error()) return dims.error();
  const IndexerBuffers io = IndexScoresIo(*dims, query, weights, keys, key_scale, lengths, scores);
  // XLA aligns buffers to far more than this; a misaligned view would fault in the 16-byte copies.
  if (!Aligned(io.query, 16) || !Aligned(io.keys, 16))
    return ffi::Error::InvalidArgument("hisparse_index_scores: q and keys must be 16-byte aligned");
  const cudaError_t err = LaunchIndexScores(*dims, io, stream);
  return LaunchResult("hisparse_index_scores", "indexer kernel", err);
}

}  // namespace
}  // namespace hisparse

HISPARSE_DEFINE_CUDA_HANDLER(HisparseIndexScoresCuda, hisparse::IndexScoresCudaImpl,
                             hisparse::BindIndexScoresOperands);
