"""Checks a researcher calls from their own tests, with their own model family.

The project's own suite proves three things of every shipped family (dsa, nsa, quest); these
helpers prove the same of any `hisparse_jax.models.Family` (or a family name), with the caller's
Config and weights, on CPU at tiny sizes in seconds and on a GPU alike:

- `assert_hisparse_matches_device`: decoding through the hierarchical cache ("hisparse": records
  in a pinned-host pool, fetched into a small hot buffer) gives the tokens and logits of the
  full-KV decode ("device"), bit for bit. The modes run the same ops on the same shapes and only
  the placement of records differs, so any difference, even one ulp, is a bug in the family.
- `assert_dense_matches_selecting_every_record`: the "dense" mode (attention to every record in
  place) equals a sparse decode whose top-k is every record, bit for bit: the family's selection
  path computes the same attention as its dense path.
- `assert_clean_decode_program`: the compiled decode program keeps the pool in host memory
  (S(5)) and never copies it, runs one RESOLVE per sparse layer per step, and copies no weight-,
  key- or KV-sized array (every step reads them in place).

Each raises AssertionError with a one-line message saying where the first difference is, and a
bad argument raises a one-line TypeError or ValueError naming the argument and the fix.
docs/testing.md has an example to paste into a test file.
"""

from __future__ import annotations

from .program import (IN_PLACE, assert_clean_decode_program, assert_host_pool_stays_pinned, assert_no_big_copies,
                      assert_one_resolve_per_sparse_layer_per_step, ffi_calls, fully_optimized, trace_decode)
from .runs import (Run, assert_dense_matches_selecting_every_record, assert_hisparse_matches_device,
                   assert_runs_equal, every_record_config, run_decode)

__all__ = [
    "IN_PLACE", "Run", "assert_clean_decode_program", "assert_dense_matches_selecting_every_record",
    "assert_hisparse_matches_device", "assert_host_pool_stays_pinned", "assert_no_big_copies",
    "assert_one_resolve_per_sparse_layer_per_step", "assert_runs_equal", "every_record_config", "ffi_calls",
    "fully_optimized", "run_decode", "trace_decode",
]
