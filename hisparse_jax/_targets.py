"""FFI target names: the ABI between Python and the compiled handlers.

Every target is registered under these names for each platform that has a
handler; tests assert the set, so a rename is a deliberate ABI change.
"""

RESOLVE = "hisparse_resolve"
POOL_WRITE = "hisparse_pool_write"

ALL = (RESOLVE, POOL_WRITE)

# Keys of the capsule dicts exported by the nanobind module, per target.
CAPSULE_KEYS = {RESOLVE: "resolve", POOL_WRITE: "pool_write"}
