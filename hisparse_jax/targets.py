"""FFI target names: the ABI between Python and the compiled handlers, and a public fact.

Every target is registered under these names for each platform that has a
handler; tests assert the set, so a rename is a deliberate ABI change. The
names appear in compiled programs as custom_call_target="...", so
`hisparse_jax.targets.RESOLVE in jitted.lower(...).compile().as_text()` tells
whether a program calls the FFI RESOLVE (and how often).
"""

RESOLVE = "hisparse_resolve"
POOL_WRITE = "hisparse_pool_write"
TOPK = "hisparse_topk"
INDEX_SCORES = "hisparse_index_scores"
GROUPED_MATMUL = "hisparse_grouped_matmul"
RESOLVE_PREFETCH = "hisparse_resolve_prefetch"
PREFETCH_JOIN = "hisparse_prefetch_join"
SPARSE_ATTENTION = "hisparse_sparse_attention"
MOE_ROUTE = "hisparse_moe_route"

ALL = (RESOLVE, POOL_WRITE, TOPK, INDEX_SCORES, GROUPED_MATMUL, RESOLVE_PREFETCH, PREFETCH_JOIN, SPARSE_ATTENTION,
       MOE_ROUTE)

# Targets with a CUDA handler only: on CPU their ops run the XLA reference.
CUDA_ONLY = (INDEX_SCORES, GROUPED_MATMUL, SPARSE_ATTENTION)

# Keys of the capsule dicts exported by the nanobind module, per target.
CAPSULE_KEYS = {
    RESOLVE: "resolve",
    POOL_WRITE: "pool_write",
    TOPK: "topk",
    INDEX_SCORES: "index_scores",
    GROUPED_MATMUL: "grouped_matmul",
    RESOLVE_PREFETCH: "resolve_prefetch",
    PREFETCH_JOIN: "prefetch_join",
    SPARSE_ATTENTION: "sparse_attention",
    MOE_ROUTE: "moe_route",
}
