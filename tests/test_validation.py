"""Every trace-time error names the argument and the fix (docs/contract.md,
"Errors"); the checked mode turns invalid ids and malformed states into errors;
the FFI handlers refuse malformed operands instead of reading out of bounds."""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental import checkify

import hisparse_jax as hs
from hisparse_jax import targets
from hisparse_jax import config as config_module
from helpers import IMPLEMENTATIONS, config, jitted_resolve, to_device, to_pinned_host

needs_ffi = pytest.mark.skipif("ffi" not in IMPLEMENTATIONS, reason="no FFI handler for this backend")
REPO = Path(__file__).resolve().parents[1]


def row(id: str, *values):
    """One case of an error table, named first so the table reads as a list of names."""
    return pytest.param(*values, id=id)


@dataclasses.dataclass
class Operands:
    """RESOLVE operands built by hand, so any one of them can be made wrong."""

    cache: hs.HotCache
    host_pool: jax.Array
    selection: jax.Array
    sealed: jax.Array
    layer: object = 0

    def replace(self, **kw):
        return dataclasses.replace(self, **kw)

    def with_cache(self, **kw):
        return self.replace(cache=dataclasses.replace(self.cache, **kw))

    def resolve(self, implementation="auto", **kw):
        return hs.resolve(
            self.cache,
            self.host_pool,
            self.selection,
            self.sealed,
            self.layer,
            implementation=implementation,
            **kw,
        )


def operands(L=3, streams=(2,), R=8, B=4, k=3, record=(1, 2), dtype=np.float32) -> Operands:
    return Operands(
        cache=hs.HotCache(
            hot=jnp.zeros((L, *streams, B, *record), dtype),
            slot_record=jnp.full((L, *streams, B), -1, jnp.int32),
            lru=jnp.broadcast_to(jnp.arange(B, dtype=jnp.int32), (L, *streams, B)),
        ),
        host_pool=to_pinned_host(np.zeros((L, *streams, R, *record), dtype)),
        selection=jnp.zeros((*streams, k), jnp.int32),
        sealed=jnp.full(streams, R, jnp.int32),
    )


# --------------------------------------------------------------------------- CacheConfig


@pytest.mark.parametrize(
    "kwargs, message",
    [
        row("B_below_k", dict(B=2, k=3),
            r"CacheConfig.hot_slots \(B=2\) must be >= top_k \(k=3\).*raise hot_slots or lower top_k"),
        row("record_bytes", dict(width=3),
            r"a record is 12 bytes \(page_size x record_width x itemsize = 1 x 3 x 4\).*multiple of 8: pad record_width"),
        row("record_bytes_bf16_pages", dict(width=3, page_size=2, dtype=ml_dtypes.bfloat16), r"a record is 12 bytes"),
        row("k_zero", dict(k=0), r"CacheConfig.top_k must be a positive int, got 0"),
        row("negative_layers", dict(L=-1), r"CacheConfig.num_layers must be a positive int, got -1"),
        row("float_page_size", dict(page_size=2.0), r"CacheConfig.page_size must be a positive int, got 2.0"),
        row("zero_stream_dim", dict(streams=(2, 0)), r"CacheConfig.stream_shape must hold positive dims, got \(2, 0\)"),
        row("B_past_cuda_limit", dict(B=16385, k=8),
            r"CacheConfig.hot_slots \(B=16385\) exceeds 16384, the most slots the CUDA RESOLVE "
            r"kernel holds per stream; lower hot_slots"),
        row("k_past_cuda_limit", dict(B=16384, k=8193),
            r"CacheConfig.top_k \(k=8193\) exceeds 8192, the most records the CUDA RESOLVE kernel "
            r"selects per stream; lower top_k"),
        row("both_past_cuda_limits", dict(B=20000, k=10000), r"CacheConfig.hot_slots \(B=20000\) exceeds 16384"),
    ],
)
def test_cache_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        config(**kwargs)


def test_cache_config_takes_the_cuda_limits():
    """B = 16384 and k = 8192, the largest shapes the CUDA kernel holds, are valid."""
    cfg = config(L=1, streams=(1,), R=16384, B=16384, k=8192)
    assert (cfg.hot_slots, cfg.top_k) == (config_module.MAX_HOT_SLOTS, config_module.MAX_TOP_K)


def test_cache_config_limits_match_the_cuda_header():
    """The Python limits are the CUDA kernel's own (ffi/resolve_cuda.h)."""
    header = REPO / "ffi" / "resolve_cuda.h"
    if not header.exists():
        pytest.skip(f"{header} is not here (tests run outside the source tree)")
    text = header.read_text()
    for name, value in (
        ("kMaxResolveHotSlots", config_module.MAX_HOT_SLOTS),
        ("kMaxResolveTopK", config_module.MAX_TOP_K),
    ):
        found = re.search(rf"constexpr int64_t {name} = (\d+);", text)
        assert found, f"{name} not found in {header}"
        assert int(found.group(1)) == value, f"{name} = {found.group(1)} in {header}, {value} in config.py"


def test_cache_config_shapes():
    cfg = config(L=2, streams=(3, 4), R=10, B=6, k=5, width=8, page_size=2, dtype=ml_dtypes.bfloat16)
    assert cfg.pool_shape == (2, 3, 4, 10, 2, 8)
    assert cfg.hot_shape == (2, 3, 4, 6, 2, 8)
    assert cfg.slot_shape == (2, 3, 4, 6)
    assert cfg.record_bytes == 32 and cfg.num_streams == 12
    assert cfg.host_bytes == 2 * 12 * 10 * 32
    assert cfg.device_bytes == 2 * 12 * 6 * (32 + 8)


# --------------------------------------------------------------------------- resolve


def test_valid_operands_pass(implementation):
    """The baseline every error case below changes one thing of (traced only:
    the checks run at trace time)."""
    result, cache = jax.eval_shape(lambda: operands().resolve(implementation))
    assert result.slots.shape == (2, 3) and cache.hot.shape == (3, 2, 4, 1, 2)


def _bad_resolve_operands():
    # A table, one bad operand per row, read top to bottom like the checks it tests.
    ok = operands()
    bf16 = operands(dtype=ml_dtypes.bfloat16)
    return [
        row("B_below_k", operands(B=4, k=5), ValueError, r"resolve: hot_slots B=4 < top_k k=5.*hot_slots >= k"),
        row("record_bytes", operands(record=(1, 3)), ValueError,
            r"resolve: a record of host_pool is 12 bytes \(shape \(1, 3\), float32\).*multiple of 8: pad record_width"),
        row("selection_int16", ok.replace(selection=ok.selection.astype(jnp.int16)), TypeError,
            r"resolve: selection must be int32, got int16; cast it with .astype\(jnp.int32\)"),
        row("selection_float", ok.replace(selection=ok.selection.astype(jnp.float32)), TypeError,
            r"resolve: selection must be int32, got float32"),
        row("sealed_uint32", ok.replace(sealed=ok.sealed.astype(jnp.uint32)), TypeError,
            r"resolve: sealed must be int32, got uint32"),
        row("slot_record_dtype", ok.with_cache(slot_record=ok.cache.slot_record.astype(jnp.int16)), TypeError,
            r"resolve: cache.slot_record must be int32"),
        row("lru_dtype", ok.with_cache(lru=ok.cache.lru.astype(jnp.uint8)), TypeError,
            r"resolve: cache.lru must be int32"),
        row("hot_vs_pool_dtype", ok.with_cache(hot=bf16.cache.hot), TypeError,
            r"resolve: cache.hot is bfloat16 but host_pool is float32; records are copied bit for bit"),
        row("selection_scalar", ok.replace(selection=jnp.int32(0)), ValueError,
            r"resolve: selection must be \[\*streams, k\], got a scalar"),
        row("sealed_shape", ok.replace(sealed=jnp.zeros((3,), jnp.int32)), ValueError,
            r"resolve: sealed has shape \(3,\), expected the stream shape \(2,\) of selection"),
        row("pool_streams", ok.replace(selection=jnp.zeros((3, 3), jnp.int32), sealed=jnp.zeros((3,), jnp.int32)), ValueError,
            r"resolve: host_pool has shape \(3, 2, 8, 1, 2\), expected \[L, \*streams, R, \*record\] with streams = \(3,\)"),
        row("slot_record_layers", ok.with_cache(slot_record=jnp.zeros((2, 2, 4), jnp.int32)), ValueError,
            r"resolve: cache.slot_record has shape \(2, 2, 4\), expected \[L, \*streams, B\] = \[3, 2, B\]"),
        row("slot_record_rank", ok.with_cache(slot_record=jnp.zeros((3, 2, 4, 1), jnp.int32)), ValueError,
            r"resolve: cache.slot_record has shape \(3, 2, 4, 1\)"),
        row("lru_shape", ok.with_cache(lru=jnp.zeros((3, 2, 5), jnp.int32)), ValueError,
            r"resolve: cache.lru has shape \(3, 2, 5\), expected \(3, 2, 4\)"),
        row("hot_record", ok.with_cache(hot=jnp.zeros((3, 2, 4, 1, 4), jnp.float32)), ValueError,
            r"resolve: cache.hot has shape \(3, 2, 4, 1, 4\), expected \[L, \*streams, B, \*record\] = \(3, 2, 4, 1, 2\)"),
        row("hot_slots", ok.with_cache(hot=jnp.zeros((3, 2, 5, 1, 2), jnp.float32)), ValueError,
            r"resolve: cache.hot has shape \(3, 2, 5, 1, 2\)"),
        row("layer_past_L", ok.replace(layer=3), ValueError,
            r"resolve: layer=3 is outside \[0, 3\) \(host_pool has L=3 layers\)"),
        row("layer_negative", ok.replace(layer=-1), ValueError, r"resolve: layer=-1 is outside \[0, 3\)"),
        row("layer_numpy_int", ok.replace(layer=np.int64(7)), ValueError, r"resolve: layer=7 is outside \[0, 3\)"),
        row("layer_float", ok.replace(layer=jnp.float32(0)), TypeError, r"resolve: layer must be int32, got float32"),
        row("layer_vector", ok.replace(layer=jnp.zeros((1,), jnp.int32)), ValueError,
            r"resolve: layer must be a scalar, got shape \(1,\)"),
        # JAX without x64 casts an int64 NumPy array to int32 by dropping the high bits: 2**32 + 1 -> 1
        row("selection_int64_wraps", ok.replace(selection=np.asarray(ok.selection, np.int64) + 2**32), ValueError,
            r"resolve: selection holds 42949672\d\d, outside int32 \[-2147483648, 2147483647\].*a cast would wrap"),
        row("sealed_int64_wraps", ok.replace(sealed=np.asarray(ok.sealed, np.int64) - 2**32), ValueError,
            r"resolve: sealed holds -42949672\d\d, outside int32"),
        row("selection_list_wraps", ok.replace(selection=[[0, 1, 2**40], [0, 1, 2]]), ValueError,
            r"resolve: selection holds 1099511627776, outside int32"),
    ]


@pytest.mark.parametrize("ops, error, message", _bad_resolve_operands())
def test_resolve_errors(implementation, ops, error, message):
    with pytest.raises(error, match=message):
        ops.resolve(implementation)


@pytest.mark.parametrize("ops, error, message", _bad_resolve_operands()[:3])
def test_resolve_errors_under_jit(implementation, ops, error, message):
    """The same checks run at trace time inside jit, before anything runs."""
    layer = ops.layer

    @jax.jit
    def f(cache, pool, selection, sealed):
        return hs.resolve(cache, pool, selection, sealed, layer, implementation=implementation)

    with pytest.raises(error, match=message):
        f(ops.cache, ops.host_pool, ops.selection, ops.sealed)


@needs_ffi
def test_ffi_needs_pinned_host_pool():
    ops = operands()
    device_pool = to_device(np.zeros(ops.host_pool.shape, np.float32))
    with pytest.raises(
        ValueError, match=r"resolve: host_pool must live in pinned_host memory.*alloc_host_pool"
    ):
        ops.replace(host_pool=device_pool).resolve("ffi")


def test_reference_accepts_a_device_pool():
    """The reference reads any memory kind; only the handlers need pinned_host."""
    ops = operands()
    pool = np.arange(np.prod(ops.host_pool.shape), dtype=np.float32).reshape(ops.host_pool.shape)
    sel = jnp.array([[0, 5, -1], [7, 7, 2]], jnp.int32)
    call = jitted_resolve("reference")
    pinned = call(ops.cache, to_pinned_host(pool), sel, ops.sealed, np.int32(1))
    device = call(ops.cache, to_device(pool), sel, ops.sealed, np.int32(1))
    for a, b in zip(jax.tree.leaves(pinned), jax.tree.leaves(device)):
        np.testing.assert_array_equal(a, b, strict=True)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        row("implementation", dict(implementation="cuda"),
            r"implementation must be 'auto', 'ffi' or 'reference', got 'cuda'"),
        row("launch", dict(implementation="reference", launch="fast"),
            r"launch must be 'auto', 'fused' or 'split', got 'fast'"),
    ],
)
def test_resolve_option_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        operands().resolve(**kwargs)


def test_require_ffi_names_the_fix():
    with pytest.raises(
        RuntimeError, match=r"no FFI handler for platform 'tpu'.*use implementation='reference'"
    ):
        hs.require_ffi("tpu")
    if not hs.has_ffi("gpu"):
        with pytest.raises(RuntimeError, match=r"no FFI handler for platform 'gpu'.*rebuild with CUDA"):
            hs.require_ffi("gpu")


def test_gpu_backend_name_maps_to_cuda_platform():
    """jax.default_backend() says "gpu"; the handlers are registered for "CUDA"."""
    assert hs.platform_of("gpu") == "cuda" and hs.platform_of("cpu") == "cpu"
    assert hs.has_ffi("gpu") == ("cuda" in hs.ffi_platforms())
    assert hs.has_ffi("cpu") == ("cpu" in hs.ffi_platforms())


# --------------------------------------------------------------------------- checked mode


@functools.cache
def checked_resolve(implementation):
    def f(cache, pool, selection, sealed, layer):
        return hs.resolve(cache, pool, selection, sealed, layer, implementation=implementation, checked=True)

    return checkify.checkify(jax.jit(f))


@pytest.mark.parametrize(
    "selection, sealed, layer, invalid",
    [
        row("valid_and_padding", [[0, 1, -1], [7, -1, -1]], [8, 8], 0, 0),
        row("not_sealed", [[0, 1, -1], [7, -1, -1]], [8, 7], 0, 1),
        row("past_R_and_negative", [[8, -2, -1], [0, 0, 0]], [8, 8], 1, 2),
        row("layer_out_of_range", [[0, 1, 2], [3, -1, -1]], [8, 8], 3, 4),
    ],
)
def test_checked_mode(implementation, selection, sealed, layer, invalid):
    ops = operands()
    err, (result, _) = checked_resolve(implementation)(
        ops.cache,
        ops.host_pool,
        jnp.array(selection, jnp.int32),
        jnp.array(sealed, jnp.int32),
        jnp.int32(layer),
    )
    assert int(result.invalid.sum()) == invalid
    if invalid:
        with pytest.raises(
            checkify.JaxRuntimeError,
            match=rf"resolve: {invalid} selected ids were neither -1 nor in \[0, min\(sealed, R\)\)",
        ):
            err.throw()
    else:
        err.throw()


def test_checked_mode_names_a_malformed_state(implementation):
    ops = operands()
    lru = np.array(ops.cache.lru)
    lru[0, 1, 2] = 1 << 30  # stream 1 of layer 0
    err, (result, cache) = checked_resolve(implementation)(
        dataclasses.replace(ops.cache, lru=jnp.asarray(lru)),
        ops.host_pool,
        jnp.array([[0, 1, -1], [7, -1, -1]], jnp.int32),
        ops.sealed,
        jnp.int32(0),
    )
    np.testing.assert_array_equal(result.malformed, [0, 1])
    np.testing.assert_array_equal(np.asarray(cache.lru)[0, 1], lru[0, 1])
    with pytest.raises(
        checkify.JaxRuntimeError,
        match=r"resolve: 1 streams hold a malformed cache state \(lru not a permutation of \[0, B\), "
        r"or slot_record outside \[-1, R\) or holding a record twice\) and resolved nothing; "
        r"rebuild the cache with init_hot_cache / reset_streams",
    ):
        err.throw()


def test_unchecked_mode_emits_no_check(implementation):
    ops = operands()

    def f(cache, pool, selection, sealed):
        return hs.resolve(cache, pool, selection, sealed, 0, implementation=implementation)

    err, _ = checkify.checkify(jax.jit(f))(
        ops.cache, ops.host_pool, jnp.full((2, 3), 99, jnp.int32), ops.sealed
    )
    assert err.get() is None


# --------------------------------------------------------------------------- write_records


def _pool_write_operands(dtype=np.float32, record=(1, 2)):
    pool = to_pinned_host(np.zeros((2, 3, 8, *record), dtype))
    records = jnp.zeros((2, 3, 2, *record), dtype)
    return pool, records, jnp.zeros((3,), jnp.int32), jnp.ones((3,), jnp.int32)


def _bad_write_operands():
    pool, records, start, count = _pool_write_operands()
    return [
        row("start_dtype", (pool, records, start.astype(jnp.float32), count), TypeError,
            r"write_records: start must be int32, got float32"),
        row("count_dtype", (pool, records, start, count.astype(jnp.int16)), TypeError,
            r"write_records: count must be int32, got int16"),
        row("count_shape", (pool, records, start, jnp.ones((2,), jnp.int32)), ValueError,
            r"write_records: count has shape \(2,\), expected the shape \(3,\) of start"),
        row("pool_streams", (pool, records[:, :2], start[:2], count[:2]), ValueError,
            r"write_records: host_pool has shape \(2, 3, 8, 1, 2\), expected \[L, \*streams, R, \*record\] with streams = \(2,\)"),
        row("records_layers", (pool, records[:1], start, count), ValueError,
            r"write_records: records has shape \(1, 3, 2, 1, 2\), expected \[L, \*streams, n, \*record\] = \[2, 3, n, 1, 2\]"),
        row("records_width", (pool, jnp.zeros((2, 3, 2, 1, 4)), start, count), ValueError,
            r"write_records: records has shape \(2, 3, 2, 1, 4\)"),
        row("records_dtype", (pool, records.astype(jnp.bfloat16), start, count), TypeError,
            r"write_records: records is bfloat16 but host_pool is float32"),
        row("records_in_host_memory", (pool, jax.device_put(records, hs.pinned_host_sharding()), start, count), ValueError,
            r"write_records: records must be on device \(they come from the model\), not in host memory"),
        row("record_bytes", _pool_write_operands(record=(1, 3)), ValueError,
            r"write_records: a record of host_pool is 12 bytes.*pad record_width"),
    ]


@pytest.mark.parametrize("args, error, message", _bad_write_operands())
def test_write_records_errors(implementation, args, error, message):
    with pytest.raises(error, match=message):
        hs.write_records(*args, implementation=implementation)


@needs_ffi
def test_write_records_ffi_needs_pinned_host_pool():
    pool, records, start, count = _pool_write_operands()
    device_pool = to_device(np.zeros(pool.shape, np.float32))
    with pytest.raises(ValueError, match=r"write_records: host_pool must live in pinned_host memory"):
        hs.write_records(device_pool, records, start, count, implementation="ffi")


def test_write_records_implementation_error():
    with pytest.raises(ValueError, match=r"implementation must be 'auto', 'ffi' or 'reference', got 'fast'"):
        hs.write_records(*_pool_write_operands(), implementation="fast")


# --------------------------------------------------------------------------- the handlers' own checks


def _direct_resolve(ops: Operands, selection=None, sealed=None, stream_begin=0, stream_count=None):
    """The RESOLVE target called without the Python checks, as a careless caller would."""
    selection = ops.selection if selection is None else selection
    sealed = ops.sealed if sealed is None else sealed
    streams, k = selection.shape[:-1], selection.shape[-1]
    stream_count = int(np.prod(streams)) if stream_count is None else stream_count
    pick = jax.ShapeDtypeStruct((*streams, k), jnp.int32)
    per_stream = jax.ShapeDtypeStruct(streams, jnp.int32)
    call = jax.ffi.ffi_call(
        targets.RESOLVE,
        (
            pick,
            pick,
            pick,
            per_stream,
            per_stream,
            per_stream,
            jax.typeof(ops.cache.hot),
            jax.typeof(ops.cache.slot_record),
            jax.typeof(ops.cache.lru),
        ),
        input_output_aliases={4: 6, 5: 7, 6: 8},
    )
    out = call(
        ops.host_pool,
        selection,
        sealed,
        jnp.int32(0),
        ops.cache.hot,
        ops.cache.slot_record,
        ops.cache.lru,
        fetch=True,
        launch=np.int32(0),
        stream_begin=stream_begin,
        stream_count=stream_count,
    )
    return jax.block_until_ready(out)


@needs_ffi
@pytest.mark.parametrize(
    "ops, kwargs, message",
    [
        row("B_below_k", operands(B=4, k=5), {}, r"hisparse_resolve: hot_slots B must be >= k"),
        row("record_bytes", operands(record=(1, 3)), {},
            r"hisparse_resolve: record bytes must be a positive multiple of 8"),
        row("selection_dtype", operands(), dict(selection=jnp.zeros((2, 3), jnp.float32)),
            r"hisparse_resolve: selection must be int32"),
        row("sealed_dims", operands(), dict(sealed=jnp.zeros((3,), jnp.int32)),
            r"hisparse_resolve: sealed must have the stream dims of selection"),
        row("pool_dims", operands(), dict(selection=jnp.zeros((3, 3), jnp.int32), sealed=jnp.zeros((3,), jnp.int32)),
            r"hisparse_resolve: host_pool \[3, 2, 8, 1, 2\] must be \[L, \*streams, R, ...record\]"),
        row("stream_begin", operands(), dict(stream_begin=-1),
            r"hisparse_resolve: stream_begin -1 must be >= 0"),
        row("stream_count", operands(), dict(stream_count=-1),
            r"hisparse_resolve: stream_count -1 must be >= 0"),
        row("stream_range", operands(), dict(stream_begin=1, stream_count=2),
            r"hisparse_resolve: stream_begin \+ stream_count 1 \+ 2 exceeds the 2 streams of selection; pick a "
            r"range inside \[0, 2\)"),
    ],
)
def test_handler_refuses_malformed_operands(ops, kwargs, message):
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        _direct_resolve(ops, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "ops, message",
    [
        row("B", operands(L=1, B=16385, k=3),
            r"hisparse_resolve: slot_record B = 16385 exceeds the CUDA kernel's limit of 16384"),
        row("k", operands(L=1, B=8193, k=8193),
            r"hisparse_resolve: selection k = 8193 exceeds the CUDA kernel's limit of 8192"),
    ],
)
def test_cuda_handler_keeps_its_limits(ops, message):
    """CacheConfig refuses these shapes; a cache built by hand still meets the handler's check."""
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        _direct_resolve(ops)


@needs_ffi
def test_pool_write_handler_refuses_malformed_operands():
    pool, records, start, count = _pool_write_operands()
    call = jax.ffi.ffi_call(targets.POOL_WRITE, jax.typeof(pool), input_output_aliases={0: 0})
    with pytest.raises(
        jax.errors.JaxRuntimeError,
        match=r"hisparse_pool_write: records .* must be \[L, \*streams, n, ...record of host_pool\]",
    ):
        jax.block_until_ready(call(pool, jnp.zeros((2, 3, 2, 1, 4), jnp.float32), start, count))


def test_in_range_numpy_ints_of_any_width_pass(implementation):
    """A NumPy int64 selection whose ids fit int32 is accepted (the cast is exact)."""
    ok = operands()
    got, _ = ok.replace(selection=np.asarray(ok.selection, np.int64)).resolve(implementation)
    want, _ = ok.resolve(implementation)
    assert np.array_equal(np.asarray(got.slots), np.asarray(want.slots))


def test_topk_sealed_and_pool_write_counts_do_not_wrap():
    scores = jnp.zeros((2, 8), jnp.float32)
    with pytest.raises(ValueError, match=r"select_topk: sealed holds 4294967300, outside int32"):
        hs.select_topk(scores, np.array([4, 2**32 + 4], np.int64), 2)
    cfg = hs.CacheConfig(num_layers=1, stream_shape=(1,), pool_records=8, hot_slots=4, top_k=2, record_width=2,
                         dtype=np.float32)
    pool = hs.alloc_host_pool(cfg)
    records = jnp.zeros((1, 1, 2, 1, 2), jnp.float32)
    with pytest.raises(ValueError, match=r"write_records_inplace: start holds 4294967296, outside int32"):
        hs.write_records_inplace(pool, records, start=np.array([2**32], np.int64))


def test_every_public_cast_to_int32_is_range_checked_first():
    """write_records, rows_outside_pool, resolve_reference and write_sealed cast their integer
    operands to int32; an int64 value outside int32 is an error naming it, before the cast (a
    NumPy int64 start of 2**32 + 1 wrote at record 1; a Python int one was an OverflowError)."""
    cfg = hs.CacheConfig(num_layers=1, stream_shape=(1,), pool_records=8, hot_slots=4, top_k=2, record_width=2,
                         dtype=np.float32)
    pool = hs.alloc_host_pool(cfg)
    records = jnp.zeros((1, 1, 2, 1, 2), jnp.float32)
    for start in (np.array([2**32 + 1], np.int64), [2**32 + 1]):
        with pytest.raises(ValueError, match=r"write_records: start holds 4294967297, outside int32"):
            hs.write_records(pool, records, start, implementation="reference")
    with pytest.raises(ValueError, match=r"write_records: count holds -4294967295, outside int32"):
        hs.write_records(pool, records, np.array([0], np.int32), np.array([1 - 2**32], np.int64),
                         implementation="reference")
    with pytest.raises(ValueError, match=r"rows_outside_pool: start holds 4294967297, outside int32"):
        hs.rows_outside_pool(8, np.array([2**32 + 1], np.int64), np.array([1], np.int32), 2)
    ok = operands()
    c = ok.cache
    with pytest.raises(ValueError, match=r"resolve_reference: selection holds 4294967296, outside int32"):
        hs.resolve_reference(c.hot, c.slot_record, c.lru, ok.host_pool, np.asarray(ok.selection, np.int64) + 2**32,
                             ok.sealed, 0)
    with pytest.raises(ValueError, match=r"resolve_reference: layer holds 1099511627776, outside int32"):
        hs.resolve_reference(c.hot, c.slot_record, c.lru, ok.host_pool, ok.selection, ok.sealed, 2**40)


def test_a_concrete_int64_jax_array_under_x64_is_range_checked():
    """Under x64 a jax array can be int64: a concrete one is range-checked like a NumPy one (a
    value outside int32 is named), a traced one is refused by its dtype (no value to check yet)."""
    ok = operands()
    with jax.enable_x64(True):
        wide = jnp.asarray(np.asarray(ok.selection, np.int64) + 2**32)
        with pytest.raises(ValueError, match=r"resolve: selection holds 4294967296, outside int32"):
            ok.replace(selection=wide).resolve()
        with pytest.raises(TypeError, match=r"selection must be int32, got int64; cast it .* once its values"):
            jax.jit(lambda s: ok.replace(selection=s).resolve()[0].slots)(wide)
