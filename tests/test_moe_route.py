"""MoE ROUTE (route_experts): a NumPy oracle of ffi/moe_route.h, the XLA reference (counted and
sorted) against it, the FFI handler (C++ on CPU, CUDA on GPU) against both with zero tolerance on
all five outputs (on a GPU the weights' reciprocal is XLA's div.full.f32: see RECIPROCAL_ULPS).
Named corner cases (ties, special floats, NaN weights, E above N, k = N, no tokens), seeded runs
at the decode shapes of the deployments, hypothesis over shapes and score patterns; jit and
lax.scan; the compiled program; every error."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hisparse_jax as hs
from hisparse_jax import moe_route, targets
from hisparse_jax.moe_route import route_experts, route_experts_reference
from helpers import IMPLEMENTATIONS, examples

needs_ffi = pytest.mark.skipif("ffi" not in IMPLEMENTATIONS, reason="no FFI handler for this backend")
FIELDS = ("chosen", "weights", "order", "inverse", "group_sizes")

# --------------------------------------------------------------------------- the oracle


def order_key(scores: np.ndarray) -> np.ndarray:
    """int64 keys in IEEE 754 totalOrder (TopkOrderedKey of ffi/topk.h, as signed ints)."""
    bits = np.ascontiguousarray(scores, np.float32).view(np.int32).astype(np.int64)
    return np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def flushed(x):
    """x with subnormals as signed zeros: XLA:CPU runs its threads (and so the CPU handler) with
    denormals flushed on input and output (DAZ and FTZ); CUDA keeps them (ffi/moe_route.h)."""
    x = np.asarray(x, np.float32)
    return np.where(np.abs(x) < np.finfo(np.float32).tiny, np.copysign(np.float32(0), x), x).astype(np.float32)


def oracle(scores: np.ndarray, k: int, experts: int, scaling: float,
           flush: bool | None = None) -> dict[str, np.ndarray]:
    """ffi/moe_route.h's rules 1-3, written again in NumPy one token at a time; the weights'
    arithmetic with subnormals flushed where the backend flushes them (`flush`: on a CPU)."""
    flush = jax.default_backend() == "cpu" if flush is None else flush
    ftz = flushed if flush else (lambda x: np.asarray(x, np.float32))
    scores = np.ascontiguousarray(scores, np.float32)
    T, N = scores.shape
    keys = order_key(scores)
    chosen = np.zeros((T, k), np.int32)
    weights = np.zeros((T, k), np.float32)
    # On a GPU: the weights with each reciprocal within RECIPROCAL_ULPS of the IEEE one (div.full.f32).
    nearby = np.zeros((2 * RECIPROCAL_ULPS + 1, T, k), np.float32)
    scale = np.float32(scaling)
    with np.errstate(all="ignore"):
        for t in range(T):
            ids = np.lexsort((np.arange(N), -keys[t]))  # key descending, then id ascending
            chosen[t] = ids[:k]
            top = scores[t, chosen[t]]  # the NaN test below sees the raw bits: flushing keeps NaNs
            total = ftz(top[0])
            for j in range(1, k):
                total = ftz(total + ftz(top[j]))
            reciprocal = ftz(np.float32(1) / total)
            weights[t] = weight(ftz, top, reciprocal, scale)
            for i, r in enumerate(stepped(reciprocal, RECIPROCAL_ULPS)):
                nearby[i, t] = weight(ftz, top, r, scale)
    local = (chosen % experts).reshape(-1)
    order = np.argsort(local, kind="stable").astype(np.int32)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size, dtype=np.int32)
    return dict(chosen=chosen, weights=weights, order=order, inverse=inverse,
                group_sizes=np.bincount(local, minlength=experts).astype(np.int32), nearby_weights=nearby)


def weight(ftz, top: np.ndarray, reciprocal: np.float32, scale: np.float32) -> np.ndarray:
    """Rule 2's (top x reciprocal) x scaling, a NaN stored as NAN_BITS."""
    w = ftz(ftz(ftz(top) * reciprocal) * ftz(scale))
    return np.where(np.isnan(w), np.uint32(moe_route.NAN_BITS).view(np.float32), w)


def stepped(x: np.float32, ulps: int) -> list[np.float32]:
    """x and the float32 values up to `ulps` steps either side of it (subnormal steps included)."""
    out, down, up = [x], x, x
    for _ in range(ulps):
        down, up = np.nextafter(down, np.float32(-np.inf)), np.nextafter(up, np.float32(np.inf))
        out += [down, up]
    return out


# XLA:GPU compiles a float32 divide to PTX div.full.f32 (it feeds LLVM -nvptx-prec-divf32=1): within
# 2 ulp of the IEEE quotient, not always it, and the CUDA handler takes the same instruction
# (ffi/moe_route.h). So on a GPU each weight (top x (1/sum) x scaling) of both implementations must be,
# bit for bit, the oracle's formula with one of the reciprocals within RECIPROCAL_ULPS of the IEEE
# one, and the CUDA handler's the XLA reference's bits (check_all). Everything else is bit for bit
# everywhere: the ids, order and groups of every implementation, every weight on a CPU.
RECIPROCAL_ULPS = 2
ON_GPU = jax.default_backend() == "gpu"


def assert_bits_equal(got, want: dict[str, np.ndarray], where: str = "", oracle_weights: bool = True) -> None:
    for name in FIELDS:
        g, w = np.asarray(getattr(got, name)), want[name]
        assert g.shape == w.shape and g.dtype == w.dtype, (where, name, g.shape, g.dtype, w.shape, w.dtype)
        if name == "weights" and oracle_weights and ON_GPU:
            allowed = want["nearby_weights"].view(np.uint32)
            assert (g.view(np.uint32)[None] == allowed).any(axis=0).all(), (where, name, g, w)
            continue
        assert g.view(np.uint8).tobytes() == w.view(np.uint8).tobytes(), (where, name, g, w)


def bits(values) -> np.ndarray:
    return np.asarray(values, np.uint32).view(np.float32)


_ROUTE = {}


def routed(scores, k, experts, scaling, implementation, counting=True):
    """One jitted call per (shape, k, E, scaling, implementation), cached across tests."""
    key = (np.shape(scores), k, experts, float(scaling), implementation, counting)
    if key not in _ROUTE:
        if implementation == "reference":
            fn = lambda s: route_experts_reference(s, k, experts, scaling, counting=counting)  # noqa: E731
        else:
            fn = lambda s: route_experts(s, k, experts, scaling, implementation=implementation)  # noqa: E731
        _ROUTE[key] = jax.jit(fn)
    return _ROUTE[key](jnp.asarray(scores, jnp.float32))


VARIANTS = [("reference", True), ("reference", False)] + [("ffi", True)] * ("ffi" in IMPLEMENTATIONS)


def check_all(scores, k, experts, scaling=1.0, where=""):
    want = oracle(np.asarray(scores, np.float32), k, experts, scaling)
    for implementation, counting in VARIANTS:
        assert_bits_equal(routed(scores, k, experts, scaling, implementation, counting), want,
                          f"{where} {implementation} counting={counting}")
    if ON_GPU and "ffi" in IMPLEMENTATIONS:  # the CUDA handler's weights: the reference's bits
        reference = routed(scores, k, experts, scaling, "reference", True)
        assert_bits_equal(routed(scores, k, experts, scaling, "ffi", True),
                          {f: np.asarray(getattr(reference, f)) for f in FIELDS}, f"{where} ffi == reference",
                          oracle_weights=False)
    return want


# --------------------------------------------------------------------------- named cases

SPECIALS = bits([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800123, 0x7F800000, 0xFF800000, 0x00000000,
                 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x3F800000, 0xBF800000])


def test_oracle_is_lax_top_k_on_plain_scores():
    scores = np.random.default_rng(0).standard_normal((5, 40)).astype(np.float32)
    _, ids = jax.lax.top_k(jnp.asarray(scores), 6)
    np.testing.assert_array_equal(oracle(scores, 6, 4, 1.0)["chosen"], np.asarray(ids))


def test_hand_worked_example():
    # token 0 picks experts 3 (0.9) then 1 (0.5); token 1 picks 2 then 0 (a tie: the lower id first).
    scores = np.array([[0.1, 0.5, 0.2, 0.9], [0.4, 0.0, 0.8, 0.4]], np.float32)
    want = check_all(scores, 2, 2, 2.0)
    np.testing.assert_array_equal(want["chosen"], [[3, 1], [2, 0]])
    # local experts (mod 2): pairs [1, 1, 0, 0] -> order [2, 3, 0, 1]
    np.testing.assert_array_equal(want["order"], [2, 3, 0, 1])
    np.testing.assert_array_equal(want["inverse"], [2, 3, 0, 1])
    np.testing.assert_array_equal(want["group_sizes"], [2, 2])
    np.testing.assert_array_equal(want["weights"][0], np.float32([0.9, 0.5]) * (np.float32(1) / np.float32(1.4)) * np.float32(2.0))


@pytest.mark.parametrize("case", ["ties", "all_equal", "specials", "signed_zeros", "nan_weights", "subnormal_scaling",
                                  "overflowing_sum", "raw_bits"])
def test_named_corner_cases(case):
    rng = np.random.default_rng(abs(hash(case)) % 2**32)
    scaling = 2.5
    if case == "ties":
        scores = rng.integers(0, 3, (9, 64)).astype(np.float32) / 4
    elif case == "all_equal":
        scores = np.full((4, 33), 0.25, np.float32)
    elif case == "specials":
        scores = rng.choice(SPECIALS, (12, 26)).astype(np.float32)
    elif case == "signed_zeros":
        scores = rng.choice(bits([0x00000000, 0x80000000]), (6, 20)).astype(np.float32)
    elif case == "nan_weights":  # a chosen NaN makes every weight of its token NaN (0x7FC00000)
        scores = rng.random((3, 16), np.float32)
        scores[0, 5] = bits([0x7F800001])[0]
        scores[1, 2] = bits([0x7FC00123])[0]
        scores[2, 3] = bits([0xFFC00123])[0]  # a -NaN ranks last: never chosen
    elif case == "subnormal_scaling":
        scores, scaling = rng.random((5, 32), np.float32), 1e-40
    elif case == "overflowing_sum":  # inf / inf
        scores = np.full((2, 8), 3e38, np.float32)
    else:
        scores = rng.integers(0, 2**32, (7, 50), dtype=np.uint64).astype(np.uint32).view(np.float32)
    want = check_all(scores, 8, 5, scaling, case)
    if case == "nan_weights":
        assert np.isnan(want["weights"][0]).all() and not np.isnan(want["weights"][2]).any()
        assert (want["weights"][:2].view(np.uint32) == moe_route.NAN_BITS).all()


@pytest.mark.parametrize("T,N,k,E", [(0, 8, 2, 3), (1, 1, 1, 1), (3, 7, 7, 2), (2, 5, 3, 64), (4, 9, 1, 1),
                                     (17, 256, 8, 32), (5, 40, 40, 7)])
def test_edge_shapes(T, N, k, E):
    scores = np.random.default_rng(T * 1000 + N).standard_normal((T, N)).astype(np.float32)
    want = check_all(scores, k, E, 1.5, f"T={T} N={N} k={k} E={E}")
    assert want["group_sizes"].sum() == T * k


@pytest.mark.parametrize("T", [1, 2, 4, 9, 10, 17, 41, 64, 300])
def test_decode_shapes_of_the_deployments(T):
    """glm5-h200's router: 256 scores, 8 choices, 32 local experts, routed_scaling 2.5."""
    rng = np.random.default_rng(T)
    scores = 1 / (1 + np.exp(-rng.standard_normal((T, 256)))).astype(np.float32)
    check_all(scores.astype(np.float32), 8, 32, 2.5, f"T={T}")


@settings(max_examples=examples(20), deadline=None)
@given(T=st.integers(0, 12), N=st.integers(1, 40), data=st.data())
def test_hypothesis_shapes_and_patterns(T, N, data):
    k = data.draw(st.integers(1, N))
    E = data.draw(st.integers(1, 50))
    pattern = data.draw(st.sampled_from(["normal", "ties", "specials"]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    if pattern == "normal":
        scores = rng.standard_normal((T, N)).astype(np.float32)
    elif pattern == "ties":
        scores = rng.integers(-1, 2, (T, N)).astype(np.float32)
    else:
        scores = rng.choice(SPECIALS, (T, N)).astype(np.float32)
    want = oracle(scores, k, E, 1.25)
    for implementation, counting in VARIANTS:
        # not cached: hypothesis draws many shapes
        if implementation == "reference":
            got = route_experts_reference(jnp.asarray(scores), k, E, 1.25, counting=counting)
        else:
            got = route_experts(jnp.asarray(scores), k, E, 1.25, implementation="ffi")
        assert_bits_equal(got, want, f"{implementation} counting={counting}")


# --------------------------------------------------------------------------- jit, scan, program


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_inside_lax_scan(implementation):
    steps = np.random.default_rng(3).standard_normal((4, 6, 32)).astype(np.float32)

    def body(carry, s):
        r = route_experts(s, 4, 8, 1.0, implementation=implementation)
        return carry + r.group_sizes, r

    sizes, outs = jax.jit(lambda xs: jax.lax.scan(body, jnp.zeros(8, jnp.int32), xs))(jnp.asarray(steps))
    for i in range(4):
        assert_bits_equal(jax.tree.map(lambda x, i=i: x[i], outs), oracle(steps[i], 4, 8, 1.0), f"step {i}")
    assert int(np.asarray(sizes).sum()) == 4 * 6 * 4


@needs_ffi
def test_compiled_program_calls_the_target_once():
    scores = jnp.zeros((3, 16), jnp.float32)
    text = jax.jit(lambda s: route_experts(s, 2, 4, 1.0, implementation="ffi")).lower(scores).compile().as_text()
    assert text.count(f'custom_call_target="{targets.MOE_ROUTE}"') == 1
    auto = jax.jit(lambda s: route_experts(s, 2, 4, 1.0)).lower(scores).compile().as_text()
    assert targets.MOE_ROUTE in auto  # "auto" takes the handler where it is registered


def test_reference_compiles_without_the_target():
    text = jax.jit(lambda s: route_experts(s, 2, 4, 1.0, implementation="reference")).lower(
        jnp.zeros((3, 16), jnp.float32)).compile().as_text()
    assert targets.MOE_ROUTE not in text


def test_cuda_limits_match_the_kernel_header():
    header = (Path(__file__).parent.parent / "ffi" / "moe_route_cuda.h").read_text()
    limits = dict(re.findall(r"inline constexpr int64_t (kMoeRouteMax\w+) = ([^;]+);", header))
    as_int = {name: eval(value.replace("int64_t{1}", "1"), {}) for name, value in limits.items()}  # noqa: S307
    assert as_int == {"kMoeRouteMaxPairs": moe_route.CUDA_MAX_PAIRS, "kMoeRouteMaxScores": moe_route.CUDA_MAX_SCORES,
                      "kMoeRouteMaxExperts": moe_route.CUDA_MAX_EXPERTS}
    nan = re.search(r"kMoeRouteNanBits = (0x[0-9A-Fa-f]+)u;", (Path(__file__).parent.parent / "ffi" / "moe_route.h").read_text())
    assert int(nan.group(1), 16) == moe_route.NAN_BITS


def test_cuda_domain_names_the_size_over_its_limit():
    assert "pairs T x k = 72000 exceeds the CUDA kernel's limit of 65536" in moe_route.cuda_domain_error(9000, 16, 8, 4)
    assert "scores N = 70000 exceeds" in moe_route.cuda_domain_error(2, 70000, 8, 4)
    assert "experts E = 2000 exceeds the CUDA kernel's limit of 1024" in moe_route.cuda_domain_error(2, 16, 8, 2000)
    assert moe_route.cuda_domain_error(8192, 256, 8, 1024) == ""  # every limit reached, none passed
    if jax.default_backend() != "gpu":  # the CPU handler takes every size: "auto" keeps it
        text = jax.jit(lambda s: route_experts(s, 8, 4, 1.0)).lower(jnp.zeros((9000, 16), jnp.float32)).as_text()
        assert (targets.MOE_ROUTE in text) == hs.has_ffi()


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("args,kind,message", [
    ((np.zeros((2, 3, 4), np.float32), 2, 4, 1.0), ValueError, r"scores must be \[T, N\]"),
    ((np.zeros((2, 4), np.float16), 2, 4, 1.0), TypeError, r"scores must be float32, got float16"),
    ((np.zeros((2, 0), np.float32), 1, 4, 1.0), ValueError, r"scores has N = 0"),
    ((np.zeros((2, 4), np.float32), 5, 4, 1.0), ValueError, r"k=5 must lie in \[1, N=4\]"),
    ((np.zeros((2, 4), np.float32), 0, 4, 1.0), ValueError, r"k=0 must lie"),
    ((np.zeros((2, 4), np.float32), 2.0, 4, 1.0), TypeError, r"k must be a Python int"),
    ((np.zeros((2, 4), np.float32), True, 4, 1.0), TypeError, r"k must be a Python int"),
    ((np.zeros((2, 4), np.float32), 2, 0, 1.0), ValueError, r"experts=0 must lie in \[1, 2\^31 - 1\]"),
    ((np.zeros((2, 4), np.float32), 2, 2**31, 1.0), ValueError, r"experts=2147483648"),
    ((np.zeros((2, 4), np.float32), 2, "4", 1.0), TypeError, r"experts must be a Python int"),
    ((np.zeros((2, 4), np.float32), 2, 4, float("nan")), ValueError, r"scaling=nan must be a finite float32"),
    ((np.zeros((2, 4), np.float32), 2, 4, 1e39), ValueError, r"scaling=1e\+39 must be a finite float32"),
    ((np.zeros((2, 4), np.float32), 2, 4, None), TypeError, r"scaling must be a Python float"),
])
def test_bad_arguments_name_the_argument(args, kind, message):
    with pytest.raises(kind, match=r"^route_experts: " + message) as err:
        route_experts(jnp.asarray(args[0]), *args[1:])
    assert "\n" not in str(err.value)


def test_unknown_implementation_is_refused():
    with pytest.raises(ValueError, match="implementation must be 'auto', 'ffi' or 'reference'"):
        route_experts(jnp.zeros((2, 4), jnp.float32), 2, 4, 1.0, implementation="cuda")


@needs_ffi
@pytest.mark.parametrize("outputs,attrs,message", [
    (((2, 2), (2, 2), (4,), (4,), (4,)), dict(k=2, experts=4, scaling=1.0), None),
    (((2, 3), (2, 2), (4,), (4,), (4,)), dict(k=2, experts=4, scaling=1.0), r"chosen \[2, 3\] must be \[T, k\]"),
    (((2, 2), (2, 2), (5,), (4,), (4,)), dict(k=2, experts=4, scaling=1.0), r"order \[5\] must be \[T x k\]"),
    (((2, 2), (2, 2), (4,), (4,), (3,)), dict(k=2, experts=4, scaling=1.0), r"group_sizes \[3\] must be \[experts\]"),
    (((2, 5), (2, 5), (10,), (10,), (4,)), dict(k=5, experts=4, scaling=1.0), r"k = 5 must lie in \[1, N = 4\]"),
    (((2, 2), (2, 2), (4,), (4,), (4,)), dict(k=2, experts=4, scaling=float("inf")), r"scaling must be a finite"),
])
def test_handler_checks_a_direct_call(outputs, attrs, message):
    """A direct jax.ffi.ffi_call bypassing the Python checks gets the handler's one-line error."""
    dtypes = (jnp.int32, jnp.float32, jnp.int32, jnp.int32, jnp.int32)
    call = jax.ffi.ffi_call(targets.MOE_ROUTE, tuple(jax.ShapeDtypeStruct(s, d) for s, d in zip(outputs, dtypes)))
    scores = jnp.asarray([[0.1, 0.4, 0.3, 0.2], [0.5, 0.1, 0.2, 0.9]], jnp.float32)
    run = lambda: jax.block_until_ready(call(scores, k=np.int64(attrs["k"]), experts=np.int64(attrs["experts"]),  # noqa: E731
                                              scaling=np.float32(attrs["scaling"])))
    if message is None:
        chosen, *_ = run()
        np.testing.assert_array_equal(chosen, [[1, 2], [3, 0]])
        return
    with pytest.raises(Exception, match="hisparse_moe_route: " + message):
        run()


def test_registered_where_the_extension_is_built():
    if hs.has_ffi("cpu"):
        assert "moe_route" in hs.ffi_registrations("cpu")
