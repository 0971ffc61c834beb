// Two grouped matmuls side by side (grouped_matmul_cuda.h's LaunchGroupedMatmulPair): each
// launch as it would run alone, the second on the side stream.
#include "grouped_matmul_cuda.h"
#include "side_stream_cuda.h"

namespace hisparse {

cudaError_t LaunchGroupedMatmulPair(const GroupedMatmulDims& first, const GroupedMatmulBuffers& first_io,
                                    const GroupedMatmulDims& second, const GroupedMatmulBuffers& second_io,
                                    cudaStream_t stream) {
  return RunBeside(
      stream, [&](cudaStream_t side) { return LaunchGroupedMatmul(second, second_io, side); },
      [&](cudaStream_t main) { return LaunchGroupedMatmul(first, first_io, main); });
}

}  // namespace hisparse
