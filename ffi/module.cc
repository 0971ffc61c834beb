// The nanobind extension: capsules of the FFI handlers, nothing else.
// Python registers each of them with jax.ffi.register_ffi_target at import
// (hisparse_jax/_ffi.py); the target names live in hisparse_jax/targets.py.
#include <nanobind/nanobind.h>

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* HisparseResolveCpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* HisparsePoolWriteCpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* HisparseTopkCpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* HisparseResolvePrefetchCpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* HisparsePrefetchJoinCpu(XLA_FFI_CallFrame*);
XLA_FFI_Error* HisparseMoeRouteCpu(XLA_FFI_CallFrame*);
#ifdef HISPARSE_WITH_CUDA
XLA_FFI_Error* HisparseResolveCuda(XLA_FFI_CallFrame*);
XLA_FFI_Error* HisparsePoolWriteCuda(XLA_FFI_CallFrame*);
XLA_FFI_Error* HisparseTopkCuda(XLA_FFI_CallFrame*);
XLA_FFI_Error* HisparseResolvePrefetchCuda(XLA_FFI_CallFrame*);
XLA_FFI_Error* HisparsePrefetchJoinCuda(XLA_FFI_CallFrame*);
XLA_FFI_Error* HisparseMoeRouteCuda(XLA_FFI_CallFrame*);
XLA_FFI_Error* HisparseIndexScoresCuda(XLA_FFI_CallFrame*);  // CUDA only: the CPU runs the XLA reference
XLA_FFI_Error* HisparseGroupedMatmulCuda(XLA_FFI_CallFrame*);  // CUDA only, likewise
XLA_FFI_Error* HisparseSparseAttentionCuda(XLA_FFI_CallFrame*);  // CUDA only, likewise
#endif
}

namespace nb = nanobind;

namespace {

template <typename Fn>
nb::capsule Capsule(Fn* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_hisparse_ffi, m) {
  m.def("cpu_registrations", []() {
    nb::dict d;
    d["resolve"] = Capsule(HisparseResolveCpu);
    d["pool_write"] = Capsule(HisparsePoolWriteCpu);
    d["topk"] = Capsule(HisparseTopkCpu);
    d["resolve_prefetch"] = Capsule(HisparseResolvePrefetchCpu);
    d["prefetch_join"] = Capsule(HisparsePrefetchJoinCpu);
    d["moe_route"] = Capsule(HisparseMoeRouteCpu);
    return d;
  });
  m.def("cuda_registrations", []() {
    nb::dict d;
#ifdef HISPARSE_WITH_CUDA
    d["resolve"] = Capsule(HisparseResolveCuda);
    d["pool_write"] = Capsule(HisparsePoolWriteCuda);
    d["topk"] = Capsule(HisparseTopkCuda);
    d["resolve_prefetch"] = Capsule(HisparseResolvePrefetchCuda);
    d["prefetch_join"] = Capsule(HisparsePrefetchJoinCuda);
    d["moe_route"] = Capsule(HisparseMoeRouteCuda);
    d["index_scores"] = Capsule(HisparseIndexScoresCuda);
    d["grouped_matmul"] = Capsule(HisparseGroupedMatmulCuda);
    d["sparse_attention"] = Capsule(HisparseSparseAttentionCuda);
#endif
    return d;
  });
  m.def("built_with_cuda", []() {
#ifdef HISPARSE_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
}
