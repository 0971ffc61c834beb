"""The device memory the timed decode needs beyond its state and weights, read off the compiler.

`hisparse-bench decode` times `hisparse_jax.decode.generate`: one jitted lax.scan over `steps`
decode steps, the state donated (its outputs alias its inputs). Beyond the state (the byte
account, hisparse_jax.bench.decode.capacity) and the weights (outside the device budget), a call needs:

- temp: XLA's temporary buffers (activations, the indexer's [b, T] float32 scores, top-k
  scratch, copies XLA inserts), `memory_analysis().temp_size_in_bytes`: one allocation per call;
- outputs: the outputs not aliased to a donated input (tokens [steps, b] int32, misses
  [steps, L, *streams] int32, the output tuple's index tables), output minus alias bytes;
- arguments: the call's other inputs (first tokens [b] int32, the PRNG key, the forced flag);
- trace ids: with a selection trace, the ids of the call's steps, [steps, selecting layers,
  *streams, k] int32, put on device before the call (hisparse_jax.bench.decode.runner).

Not counted: the previous call's tokens ([steps, b] int32) the runner keeps until the call
returns, and the no-IO and profiled calls (other programs at the same batch).

`program_memory` compiles that program for abstract inputs (nothing is allocated: the state as
ShapeDtypeStructs in the memory kind each array declares, the weights from jax.eval_shape of
family.init_weights) through decode's own jitted function with the static arguments the runner
passes, and reads `compiled.memory_analysis()`. Compilations are cached per process.

Working memory is not affine in the batch in general (buffer assignment packs and aligns; at
batch 1 XLA:CPU copies DSA's index-key buffers that larger batches update in place), so
`working_memory` fits an affine model to two compiled batches (`fit_batches` picks two that
bracket the batches a capacity search can answer) only for the search to start from; the search
checks its answer against compiled programs (hisparse_jax.bench.decode.capacity).
tests/bench/decode/test_working_memory.py states the residuals.

Memory kinds: on a GPU, memory_analysis reports the pinned_host pool apart (its `host_*` fields)
and the figures here are device bytes. XLA:CPU reports every buffer as device memory (its
`host_*` fields are 0): the host pool is inside argument, output and alias bytes there. It
cancels out of the figures kept here (the pool is a donated argument and an aliased output,
never a temp unless copied; tests/models/test_decode_program.py checks that it is not), and on
CPU device and host memory are the same RAM anyway. `ProgramMemory.host` keeps what the
compiler reports apart as host memory (0 on CPU).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ... import decode, layout
from ...models.family import decode_weights

# Two batches the affine model is fitted to when no search bound is known. Not batch 1: small
# dims of size 1 change what XLA does (on CPU, DSA's index keys are copied at batch 1, updated in
# place at 2 and up).
FIT_BATCHES = (2, 4)

# Compiler options of the memory-analysis compiles, by backend: settings that only change how long
# XLA searches for fast code, never which buffers the program has.
# - GPU: no autotuning. Autotuning times candidate kernels on the device (GEMM algorithms, Triton
#   tilings), the bulk of a GPU compile. It does not change the HLO the buffers are assigned for,
#   only what the chosen kernels need besides their operands: a cuBLAS GEMM's workspace (shrunk to
#   the chosen algorithm's need after autotuning, kept at the default size without it) and a
#   split-K Triton config's [split_k, M, N] float32 partial sums (which autotuning may pick). So it
#   can move temp either way, by scratch of a few kernels, not by activations. Measured on an H200
#   (jax 0.11.2), the runner's autotuned compile against this one: DSA realistic at 32K, temp
#   +1.25 KiB at batch 137 (full-KV) and +4.25 KiB at 462 (hisparse) of 0.35 and 1.1 GB; the
#   glm5-h200 slice at 128K, equal. A search answer within a few KiB of the budget could thus be one
#   too large; autotuning picks by timing, so the runner's own compile is not reproducible to the
#   byte either. Autotuning cost 4-7 s a compile there, these 2-4.5 s.
# - CPU: LLVM at -O0. XLA:CPU assigns buffers on the optimized HLO before LLVM compiles the kernels,
#   so the LLVM level changes the machine code only (tests/bench/decode/test_working_memory.py compares
#   these figures with the default compile of the real call, byte for byte); it halves the compile.
_COMPILER_OPTIONS = {
    "gpu": {"xla_gpu_autotune_level": 0},
    "cuda": {"xla_gpu_autotune_level": 0},
    "rocm": {"xla_gpu_autotune_level": 0},
    "cpu": {"xla_backend_optimization_level": 0},
}


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
    """Device bytes of the compiled decode program at one batch, beyond state and weights.

    Attributes:
      batch, steps: the program's shapes.
      temp: XLA temporary buffers (memory_analysis temp_size).
      outputs: output bytes not aliased to a donated input (generated tokens, misses, tuple tables).
      arguments: non-state, non-weight, non-trace inputs (first tokens, PRNG key, forced flag).
      trace_ids: the selections argument, [steps, layers, *streams, k] int32 (0 without a trace).
      argument_bytes: memory_analysis argument_size (state, weights and every other input; on
        CPU the host pool too), kept to check the byte account against the program.
      host: temp + unaliased output bytes the compiler reports in host memory (0 on XLA:CPU,
        which reports none apart).
      compile_seconds: wall time to trace, lower and compile it.
    """

    batch: int
    steps: int
    temp: int
    outputs: int
    arguments: int
    trace_ids: int
    argument_bytes: int
    host: int
    compile_seconds: float

    @property
    def working(self) -> int:
        """temp + outputs + arguments: device bytes a call needs besides state, weights, trace ids."""
        return self.temp + self.outputs + self.arguments

    @property
    def total(self) -> int:
        """Every device byte a call needs besides state and weights."""
        return self.working + self.trace_ids


@dataclasses.dataclass(frozen=True)
class WorkingMemory:
    """A mode's working memory as bytes fixed + bytes per request, fitted to two compiled batches.

    `estimate(b)` is the affine estimate; `at(b)` is the compiled program's figure (it compiles
    when b was not compiled yet). Trace ids are exact by shape (`trace_ids_bytes`), and kept out
    of fixed / per_request.

    Attributes:
      family, config, mode, steps, trace, skip_indexer: the program (as the runner calls it).
      fixed, per_request: the affine fit of ProgramMemory.working at the fitted batches.
      trace_ids_per_request: trace-id bytes each request adds (0 without a trace).
      fitted: the ProgramMemory of the fitted batches.
    """

    family: ModuleType
    config: object
    mode: str
    steps: int
    trace: bool
    skip_indexer: bool
    fixed: int
    per_request: int
    trace_ids_per_request: int
    fitted: tuple[ProgramMemory, ...]

    def estimate(self, batch: int) -> int:
        """fixed + per_request x batch + the trace ids: the estimated device bytes beyond state."""
        return self.fixed + self.per_request * batch + self.trace_ids_per_request * batch

    def at(self, batch: int) -> ProgramMemory:
        """The compiled program's working memory at `batch` (compiled once per process)."""
        return program_memory(self.family, self.config, self.mode, batch, self.steps, trace=self.trace,
                              skip_indexer=self.skip_indexer)


def fit_batches(upper: int) -> tuple[int, int]:
    """Two batches to fit at for a search whose answer lies in [0, upper]: `upper` itself (the
    usual answer when working memory is small next to the state, so its check reuses the fitted
    compile) and about half of it, both 2 or more (batch 1 is special, see FIT_BATCHES)."""
    if int(upper) < 0:
        raise ValueError(f"fit_batches: upper must be >= 0, got {upper}")
    high = max(int(upper), 3)
    return max(2, high // 2), high


def working_memory(family: ModuleType, config, mode: str, steps: int, *, trace: bool,
                   skip_indexer: bool = False, batches: tuple[int, int] = FIT_BATCHES) -> WorkingMemory:
    """The working memory of `mode`'s timed decode (`steps` steps a call, trace ids or the
    model's own selection), fitted at two `batches` (compiled once per process each)."""
    if len(batches) != 2 or not all(isinstance(b, (int, np.integer)) and b >= 1 for b in batches) \
            or batches[0] >= batches[1]:
        raise ValueError(f"working_memory: batches must be two increasing batches >= 1, got {batches!r}")
    (b0, b1), (m0, m1) = batches, [
        program_memory(family, config, mode, b, steps, trace=trace, skip_indexer=skip_indexer) for b in batches
    ]
    # Rounded up: the estimate only starts the capacity search, which checks compiled batches.
    per = -(-(m1.working - m0.working) // (b1 - b0))
    trace_per = trace_ids_bytes(family, config, 1, steps) if trace else 0
    return WorkingMemory(
        family=family, config=config, mode=mode, steps=int(steps), trace=bool(trace),
        skip_indexer=bool(skip_indexer), fixed=m0.working - per * b0, per_request=per,
        trace_ids_per_request=trace_per, fitted=(m0, m1),
    )


def trace_ids_bytes(family: ModuleType, config, batch: int, steps: int) -> int:
    """Bytes of one call's trace ids, [steps, layers, *streams, k] int32 (family.selecting_layout)."""
    return 4 * int(np.prod(selections_shape(family, config, batch, steps)))


def selections_shape(family, config, batch: int, steps: int) -> tuple[int, ...]:
    """The shape of one call's trace ids, [steps, selecting layers, *streams, k] (what the runner
    puts on device and the program takes as `selections`)."""
    layers, streams, _ = family.selecting_layout(config, batch)
    return (int(steps), layers, *streams, config.top_k)


def abstract_state(family: ModuleType, config, batch: int, mode: str):
    """family.init_state(config, batch, mode) as ShapeDtypeStructs on the first local device, each
    in the memory kind its layout declares (the host pool in pinned_host). Nothing is allocated.

    A NamedSharding over a one-device mesh: a ShapeDtypeStruct carries its memory kind into the
    trace only through a NamedSharding (a SingleDeviceSharding's pinned_host kind reaches the trace
    as device memory). The compiled program equals the one for real arrays on a
    SingleDeviceSharding up to sharding annotations (tests/bench/decode/test_working_memory.py compares
    their memory analyses)."""
    mesh = Mesh(np.array(jax.local_devices()[:1]), ("one",))
    state = jax.eval_shape(lambda: family.init_state(config, batch, mode))
    return layout.map_arrays(
        lambda leaf: jax.ShapeDtypeStruct(
            leaf.value.shape, leaf.value.dtype,
            sharding=NamedSharding(mesh, PartitionSpec(), memory_kind=leaf.layout.memory)),
        state,
    )


def program_memory(family: ModuleType, config, mode: str, batch: int, steps: int, *, trace: bool,
                   skip_indexer: bool = False) -> ProgramMemory:
    """The memory analysis of decode.generate's program at `batch`, as the runner calls it
    (greedy, no logits returned; with trace ids when `trace`). Cached per process, per backend
    and optimization setting."""
    if int(batch) < 1 or int(steps) < 1:
        raise ValueError(f"program_memory: batch and steps must be >= 1, got batch={batch}, steps={steps}")
    if skip_indexer and not trace:
        raise ValueError("program_memory: skip_indexer=True needs trace=True (what else would select?)")
    return _compiled_memory(family, config, mode, int(batch), int(steps), bool(trace), bool(skip_indexer),
                            jax.default_backend(), bool(jax.config.read("jax_disable_most_optimizations")))


@functools.lru_cache(maxsize=None)
def _compiled_memory(family, config, mode, batch, steps, trace, skip_indexer, backend, no_opt) -> ProgramMemory:
    del no_opt  # a cache key: a program compiled under another setting is another program
    start = time.perf_counter()
    state = abstract_state(family, config, batch, mode)
    # the layout the runs decode with (command.run_decode: the family's decode_weights)
    weights = jax.eval_shape(lambda: decode_weights(family, config, family.init_weights(config, 0)))
    # The arguments decode.generate builds (decode._arguments), as ShapeDtypeStructs: first tokens
    # committed like state.lengths, the key, and with a trace the ids and the forced flag as the
    # runner puts them on device (uncommitted, default memory).
    others = dict(
        first_tokens=jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=state.lengths.sharding),
        key=jax.eval_shape(lambda: jax.random.key(0)),
        forced_on=jax.ShapeDtypeStruct((), jnp.bool_) if trace else None,
    )
    selections = (jax.ShapeDtypeStruct(selections_shape(family, config, batch, steps), jnp.int32)
                  if trace else None)
    traced = decode.generate_program.trace(
        family=family, config=config, steps=steps, sampling="greedy", return_logits=False,
        skip_indexer=skip_indexer, weights=weights, state=state, selections=selections, **others)
    analysis = traced.lower().compile(_COMPILER_OPTIONS.get(backend)).memory_analysis()
    seconds = time.perf_counter() - start
    return ProgramMemory(
        batch=batch,
        steps=steps,
        temp=int(analysis.temp_size_in_bytes),
        outputs=int(analysis.output_size_in_bytes - analysis.alias_size_in_bytes),
        arguments=nbytes(others),
        trace_ids=nbytes(selections),
        argument_bytes=int(analysis.argument_size_in_bytes),
        host=int(analysis.host_temp_size_in_bytes + analysis.host_output_size_in_bytes
                 - analysis.host_alias_size_in_bytes),
        compile_seconds=seconds,
    )


def nbytes(tree) -> int:
    """Bytes of every array (or ShapeDtypeStruct) of a pytree; a PRNG key counts its key data."""
    total = 0
    for x in jax.tree.leaves(tree):
        dtype = x.dtype
        if jnp.issubdtype(dtype, jax.dtypes.prng_key):
            shape = jax.eval_shape(jax.random.key_data, x)
            total += int(np.prod(shape.shape)) * np.dtype(shape.dtype).itemsize
        else:
            total += int(np.prod(x.shape)) * np.dtype(dtype).itemsize
    return total
