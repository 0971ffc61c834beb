"""The wgmma sparse attention kernel's shared-memory layout and register fragments, without a GPU.

ffi/sparse_attention_wgmma.cuh copies Q and each 32-token stage into shared memory with one
address formula and lets the tensor cores read them through matrix descriptors (start, leading
and stride byte offsets) under PTX's canonical no-swizzle layouts, K-major for the scores and
N-major for P @ V. A wrong offset there does not fail loudly on a GPU: it multiplies the wrong
numbers. These tests put the kernel's formulas (read from its source, so the two cannot drift
apart) against the canonical layouts' formulas (PTX ISA, "Shared Memory Matrix Layout",
canonical layouts in CuTe notation) for every operand of every k-step, the copies' coverage, the
descriptors' bit fields, and the accumulator -> A-fragment repacking of P against the PTX
fragment layouts. The arithmetic itself is checked on the GPU (ffi/tests, the CPU oracle's bound).
"""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

SOURCE = pathlib.Path(__file__).resolve().parents[1] / "ffi" / "sparse_attention_wgmma.cuh"
W, DV, HEADS, STAGE = 576, 512, 64, 32
BUFFERS = 2  # step buffers (kWgBuffers), each of STEP_STAGES stage buffers
STEP_STAGES = 2  # a step's stages: warpgroup w scores stage w (kWgStepStages)
GROUP = W // 8 * 128  # bytes of 8 rows of core matrices (kWgGroupBytes)


@pytest.fixture(scope="module")
def source() -> str:
    return re.sub(r"\s+", " ", SOURCE.read_text())


def stored(row, e):
    """Byte offset where the kernel's copies put element e of row `row` (a head of Q, a token of
    a stage): 16-byte piece e // 8 of the row at piece * 128 + (row / 8) * GROUP + (row % 8) * 16."""
    return (e // 8) * 128 + (row // 8) * GROUP + (row % 8) * 16 + (e % 8) * 2


def k_major(start, lbo, sbo, row, k):
    """PTX, K-major, no swizzle, 16-bit elements (T = 8): ((8,m),(T,2k)):((1T,SBO),(1,LBO)), bytes."""
    return start + (row % 8) * 16 + (row // 8) * sbo + (k % 8) * 2 + (k // 8) * lbo


def mn_major(start, lbo, sbo, mn, k):
    """PTX, MN-major, no swizzle, 16-bit elements: ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)), bytes."""
    return start + (mn % 8) * 2 + (mn // 8) * sbo + (k % 8) * 16 + (k // 8) * lbo


def test_the_kernel_uses_these_formulas(source):
    """The constants, copies and descriptors below are the kernel's own (a change there must
    change this test's model too)."""
    for text in [
        "kWgBuffers = 2",
        "kWgStepStages = 2",
        "uint8_t kv[kWgBuffers][kWgStepStages][kWgStageBytes];",
        "kWgGroupBytes = kWgPieces * 128",
        "kWgPieces = kW / 8",
        # the producers' copies: thread p's tokens p_tok + 16 hf, pieces pc = p_piece + 8 i; the
        # query's head h, piece pc
        "const int p_tok = me % 8 + 8 * (me / 64), p_piece = (me / 8) % 8;",
        "const int tok = p_tok + 16 * hf;",
        "for (int i = 0; i < kWgPieces / 8; ++i) { const int pc = p_piece + 8 * i;",
        "const int h = i % 8 + 8 * (i / (8 * kWgPieces)), pc = (i / 8) % kWgPieces;",
        "SmemAddr(sm.kv[buf][h]) + (tok / 8) * kWgGroupBytes + (tok % 8) * 16;",
        "WgCpAsync16(dst + pc * 128, src + (row >= 0 ? pc * 8 : 0), row >= 0 ? 16 : 0);",
        "SmemAddr(sm.q) + pc * 128 + (h / 8) * kWgGroupBytes + (h % 8) * 16, a.q + (x.head0 + h) * kW + pc * 8, 16)",
        "for (int i = me; i < kHt * kWgPieces; i += kWgProducers)",
        "constexpr int kWgProducers = 128;",
        # the descriptors and their k-step advances (in the 16-byte start field)
        "wgmma::Descriptor(q_addr, 128, kWgGroupBytes)",
        "wgmma::Descriptor(k_addr, 128, kWgGroupBytes)",
        "WgScore(s, desc_q + ks * 16, desc_k + ks * 16, ks > 0)",
        # warpgroup wg scores all 32 tokens of the step's stage wg, from the stage's start
        "WgStageScores<4>(sc, q_addr, SmemAddr(sm.kv[buf][wg]), sm.valid[buf][wg], 0, a.scale, q4, mx0, mx1);",
        "const int tok = tok0 + 8 * j + 2 * q4 + (r & 1);",
        # P @ V of stage h reads that stage's buffer
        "WgStageValues(o, pa, SmemAddr(sm.kv[buf][h]), wg);",
        "wgmma::Descriptor(kv_addr + wg * kWgColumns * 16, kWgGroupBytes, 128)",
        "WgValue(o[nb], pa[ks], desc_v + ((ks * 2 * kWgGroupBytes + nb * 128 * 16) >> 4))",
        # the instructions: both operands K-major for the scores, V N-major (imm-trans-b 1)
        "m64n32k16.f32.bf16.bf16",
        "%16, %17, p, 1, 1, 0, 0;",
        "m64n128k16.f32.bf16.bf16",
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;",
        # P's repacking (test_p_fragments)
        "pa[j / 2][(j % 2) * 2] = WgPack(p[0], p[1]);",
        "pa[j / 2][(j % 2) * 2 + 1] = WgPack(p[2], p[3]);",
    ]:
        assert text in source, f"ffi/sparse_attention_wgmma.cuh no longer has {text!r}: update this test's model"


def test_score_operands_read_the_intended_elements():
    """S = Q K^T, k-step ks: A = Q (64 heads x 16) and B = K (32 tokens x 16), both from
    start + 256 ks with LBO 128, SBO GROUP, must read d = 16 ks .. 16 ks + 15 of each row."""
    rows = np.arange(HEADS)[:, None]
    k = np.arange(16)[None, :]
    for ks in range(W // 16):
        read = k_major(256 * ks, 128, GROUP, rows, k)
        np.testing.assert_array_equal(read, stored(rows, 16 * ks + k), err_msg=f"Q, k-step {ks}")
        tokens = np.arange(STAGE)[:, None]
        np.testing.assert_array_equal(k_major(256 * ks, 128, GROUP, tokens, k), stored(tokens, 16 * ks + k),
                                      err_msg=f"K, k-step {ks}")


def test_value_operands_read_the_intended_elements():
    """O += P V: warpgroup wg's columns 256 wg + 128 nb + n, tokens 16 ks + k, read N-major from
    start + wg 4096 + ks 2 GROUP + nb 2048 with LBO GROUP (8-token groups), SBO 128 (8 columns)."""
    n = np.arange(128)[:, None]
    k = np.arange(16)[None, :]
    for wg in range(2):
        for ks in range(STAGE // 16):
            for nb in range(2):
                start = wg * 256 * 16 + ks * 2 * GROUP + nb * 128 * 16
                read = mn_major(start, GROUP, 128, n, k)
                want = stored(16 * ks + k, 256 * wg + 128 * nb + n)
                np.testing.assert_array_equal(read, want, err_msg=f"V, warpgroup {wg}, k-step {ks}, n-block {nb}")
                assert (256 * wg + 128 * nb + n).max() < DV  # the value only: never the rope columns


PRODUCERS = 128


def stage_copy(p, hf, i):
    """(token, piece) of producer thread p's copy i of half hf of a stage."""
    return p % 8 + 8 * (p // 64) + 16 * hf, (p // 8) % 8 + 8 * i


STAGE_COPIES = [(p, hf, i) for hf in range(2) for i in range(W // 8 // 8) for p in range(PRODUCERS)]


def query_copy(i):
    """(head, piece) of the query copy at loop index i."""
    return i % 8 + 8 * (i // (8 * (W // 8))), (i // 8) % (W // 8)


def test_copies_fill_each_piece_once_and_stay_in_their_buffer():
    stage = [stage_copy(*c) for c in STAGE_COPIES]
    assert len(set(stage)) == len(stage) == STAGE * (W // 8)
    query = [query_copy(i) for p in range(PRODUCERS) for i in range(p, HEADS * (W // 8), PRODUCERS)]
    assert len(set(query)) == len(query) == HEADS * (W // 8)
    for rows, size in [(STAGE, STAGE // 8 * GROUP), (HEADS, HEADS // 8 * GROUP)]:
        r, e = np.meshgrid(np.arange(rows), np.arange(0, W, 8), indexing="ij")
        offsets = stored(r, e).ravel()
        assert len(np.unique(offsets)) == offsets.size  # no two pieces on the same 16 bytes
        assert offsets.min() == 0 and offsets.max() + 16 == size


def test_copies_hit_distinct_banks():
    """A warp's 16-byte shared-memory writes go out 8 threads at a time; each such quarter warp
    must write the 8 distinct 16-byte slots of a 128-byte line (no bank conflict): 8 rows of the
    same piece, one core-matrix row."""
    def slot(row, piece):
        return (stored(row, 8 * piece) // 16) % 8

    for hf in range(2):
        for i in range(W // 8 // 8):
            for first in range(0, PRODUCERS, 8):
                assert sorted(slot(*stage_copy(p, hf, i)) for p in range(first, first + 8)) == list(range(8))
    for first in range(0, HEADS * (W // 8), 8):
        assert sorted(slot(*query_copy(i)) for i in range(first, first + 8)) == list(range(8))


def descriptor(address, leading, stride):
    """wgmma::Descriptor (ffi/wgmma.cuh): start, LBO, SBO in 16-byte units at bits 0, 16 and 32; no swizzle (bits 62-63 = 0)."""
    return ((address & 0x3FFFF) >> 4) | ((leading >> 4) << 16) | ((stride >> 4) << 32)


def test_descriptor_fields_hold_every_address_the_kernel_forms():
    """The k-step advances add to the 14-bit start field: they must never carry into the LBO's
    bits, at the highest shared address of the block (1 KB reserved on sm_90, then WgSmem)."""
    stage_buffers = BUFFERS * STEP_STAGES
    exchange = STEP_STAGES * 128 * 8 * 4 + 2 * STEP_STAGES * HEADS * 4  # P fragments, row maxima and sums
    exchange += 2 * BUFFERS * 8  # the full and empty barriers
    smem = HEADS // 8 * GROUP + stage_buffers * (STAGE // 8 * GROUP) + exchange + stage_buffers * STAGE
    assert smem <= 227 * 1024  # the opt-in maximum a block may use on an H200
    base = 1024
    q, last_kv = base, base + HEADS // 8 * GROUP + (stage_buffers - 1) * (STAGE // 8 * GROUP)
    for start, lbo, sbo, step in [(q, 128, GROUP, 16 * (W // 16 - 1)), (last_kv, 128, GROUP, 16 * (W // 16 - 1)),
                                  (last_kv + 4096, GROUP, 128, (2 * GROUP + 2048) >> 4)]:
        d = descriptor(start, lbo, sbo) + step
        assert (d & 0x3FFF) == ((start >> 4) + step), "the start field overflowed"
        assert (d >> 16) & 0x3FFF == lbo >> 4 and (d >> 32) & 0x3FFF == sbo >> 4
        assert (d >> 62) == 0


def test_p_fragments():
    """The scores' accumulators (m64n32 D fragments) repacked as the A operand of P @ V (m64k16
    register fragments), per PTX's figures: D register 4 j + r of lane (g, q) holds row 16 warp + g
    (+8 for r >= 2), column 8 j + 2 q + (r & 1); A register i holds row g (+8 for odd i), columns
    2 q + 8 (i // 2) and the next, the lower column in the low half."""
    rng = np.random.default_rng(0)
    p = rng.integers(0, 1 << 16, size=(HEADS, STAGE), dtype=np.uint32)  # bf16 bit patterns
    for warp in range(4):
        for lane in range(32):
            g, q = lane // 4, lane % 4
            d = [p[16 * warp + g + 8 * (r >= 2), 8 * j + 2 * q + (r & 1)] for j in range(4) for r in range(4)]
            pa = [[0] * 4 for _ in range(2)]
            for j in range(4):  # the kernel's packing (WgPack: low half first)
                pa[j // 2][(j % 2) * 2] = d[4 * j] | (d[4 * j + 1] << 16)
                pa[j // 2][(j % 2) * 2 + 1] = d[4 * j + 2] | (d[4 * j + 3] << 16)
            for ks in range(2):
                for i in range(4):
                    row = 16 * warp + g + 8 * (i % 2)
                    col = 16 * ks + 2 * q + 8 * (i // 2)
                    assert pa[ks][i] == p[row, col] | (p[row, col + 1] << 16), (warp, lane, ks, i)
