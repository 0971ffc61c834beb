"""The device kernels of a profiler trace (hisparse_jax.bench.device_trace): read from a Perfetto
trace, summed per category and step, the record copy's overlap; and the timeline script on it.
(Kernel times come from a GPU trace; on CPU the parsing and arithmetic are tested.)"""

from __future__ import annotations

import gzip
import json

import pytest

from hisparse_jax.bench import device_trace, kernel_categories


def test_device_kernels_read_a_perfetto_trace(tmp_path):
    run = tmp_path / "plugins" / "profile" / "2026_01_01"
    run.mkdir(parents=True)
    events = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "X", "pid": 1, "name": "PjitFunction", "dur": 900.0},
        {"ph": "X", "pid": 2, "name": "loop_fusion_3", "dur": 40.0, "args": {"hlo_op": "fusion.3"}},
        {"ph": "X", "pid": 2, "name": "FetchKernel", "dur": 10.0, "args": {"hlo_op": "custom-call.1"}},
    ]
    with gzip.open(run / "host.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    kernels = device_trace.device_kernels(str(tmp_path))
    assert [(k.kernel, k.hlo_op) for k in kernels] == [("loop_fusion_3", "fusion.3"), ("FetchKernel", "custom-call.1")]
    assert [k.seconds for k in kernels] == pytest.approx([40e-6, 10e-6])
    seconds, top = device_trace.summarize(kernels, {"fusion.3": kernel_categories.Instruction("fusion", "a/attention/b", "", ())},
                                     steps=2)
    # Inside a captured command buffer every kernel carries the buffer's name: the kernel's own
    # name (an instruction's, '.' written '_') finds the instruction.
    captured = [device_trace.KernelTime("loop_fusion_3", "command_buffer_7", 1e-6)]
    instructions = kernel_categories.hlo_instructions("ENTRY %e () -> f32[] {\n  %loop_fusion.3 = f32[] fusion(), "
                                            'kind=kLoop, calls=%c, metadata={op_name="jit(g)/x/attention/exp"}\n}')
    assert device_trace.summarize(captured, instructions, steps=1)[0]["attention"] == pytest.approx(1e-6)
    assert seconds["attention"] == pytest.approx(20e-6) and seconds["IO"] == pytest.approx(5e-6)
    assert top[0] == ("attention", "loop_fusion_3", pytest.approx(20e-6))


def _two_stream_trace(tmp_path):
    """A trace of one step: compute on stream 7 (0-100 us, then 150-200 us), the prefetch's copy on
    stream 9 (50-170 us: 50 us beside the first kernel, 20 us beside the second, 50 us alone),
    and a fetch kernel on the compute stream (200-210 us: exposed)."""
    run = tmp_path / "plugins" / "profile" / "2026_01_01"
    run.mkdir(parents=True)
    gpu = {"ph": "X", "pid": 2}
    events = [
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {**gpu, "tid": 7, "name": "gemm_fusion_dot_3", "ts": 1000.0, "dur": 100.0, "args": {"hlo_op": "d.3", "hlo_module": "m"}},
        {**gpu, "tid": 9, "name": "FetchKernel<int4>", "ts": 1050.0, "dur": 120.0, "args": {}},
        {**gpu, "tid": 7, "name": "gemm_fusion_dot_4", "ts": 1150.0, "dur": 50.0, "args": {"hlo_op": "d.4", "hlo_module": "m"}},
        {**gpu, "tid": 7, "name": "FetchKernel<int4>", "ts": 1200.0, "dur": 10.0, "args": {"hlo_op": "cc.1", "hlo_module": "m"}},
    ]
    with gzip.open(run / "host.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    (tmp_path / "program.hlo.txt").write_text("HloModule m\n")
    return tmp_path


def test_io_overlap_counts_the_copy_beside_other_streams(tmp_path):
    kernels = device_trace.device_kernels(str(_two_stream_trace(tmp_path)), module="m")
    assert [k.stream for k in kernels] == ["7", "9", "7", "7"], "a fetch kernel without a module annotation is kept"
    overlap = device_trace.io_overlap(kernels, {}, steps=1)
    assert overlap["io_seconds"] == pytest.approx(130e-6)  # 120 us on stream 9 + 10 us on stream 7
    assert overlap["hidden_seconds"] == pytest.approx(70e-6)
    assert overlap["hidden_fraction"] == pytest.approx(70 / 130)
    assert device_trace.io_overlap([k for k in kernels if "gemm" in k.kernel], {}, steps=1) is None


def test_timeline_counts_kernels_and_idle_time_across_streams(tmp_path):
    kernels = device_trace.device_kernels(str(_two_stream_trace(tmp_path)), module="m")
    # Busy 1000-1210 us without a break (stream 9 covers 1100-1150), so no idle time; one step.
    found = device_trace.timeline(kernels, steps=1)
    assert found["kernels_per_step"] == 4.0 and found["idle_seconds"] == 0.0
    # Busy 210 us, though the kernels sum to more: stream 9's runs beside stream 7's.
    assert found["busy_seconds"] == pytest.approx(210e-6) and sum(k.seconds for k in kernels) > 210e-6 + 1e-9
    gemms = [k for k in kernels if "gemm" in k.kernel]  # 1000-1100 and 1150-1200: 50 us idle
    busy = device_trace.timeline(gemms, steps=2)
    assert busy["kernels_per_step"] == 1.0 and busy["idle_seconds"] == pytest.approx(25e-6)
    assert busy["busy_seconds"] == pytest.approx(75e-6)
    assert device_trace.timeline([], steps=3) == dict(kernels_per_step=0.0, idle_seconds=0.0, busy_seconds=0.0)


def test_prefetch_timeline_script(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).parents[2] / "benchmarks" / "prefetch_timeline.py"
    spec = importlib.util.spec_from_file_location("prefetch_timeline", script)
    timeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timeline)
    trace = str(_two_stream_trace(tmp_path / "trace"))
    assert timeline.main([trace, "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "record copy 0.130 ms, 0.070 ms beside other kernels: 54% hidden" in out
    assert "fetch on stream 9 at +0.050 ms for 0.120 ms; beside: weights/FFN x2" in out
    for argv, says in [(["--out", "/dev/null/x.png"], "'/dev/null' is not a folder"),
                       (["--out", str(tmp_path)], "is a folder; give a file name"),
                       (["--steps", "0"], "argument --steps: 0 is below 1")]:
        with pytest.raises(SystemExit) as exit_:  # one line, exit 2, before any work
            timeline.main([trace, "--steps", "1", *argv])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert exit_.value.code == 2 and says in err and "Traceback" not in err, err
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed: the timeline is not drawn")
    png = tmp_path / "timeline.png"
    assert timeline.main([trace, "--steps", "1", "--out", str(png)]) == 0
    assert png.stat().st_size > 0


def test_kernel_keys_name_a_kernel_across_programs():
    chunk = device_trace.KernelTime("void hisparse::(anonymous namespace)::ChunkKernel<4, false>"
                                    "(hisparse::(anonymous namespace)::ChunkArgs)", "custom-call.7", 1e-6)
    combine = device_trace.KernelTime("hisparse::(anonymous namespace)::CombineKernel(unsigned short const*, float*)",
                                      "custom-call.7", 1e-6)
    attention = kernel_categories.Instruction("custom-call", "jit(g)/attention", "hisparse_sparse_attention", ())
    assert device_trace.kernel_key(chunk, {"custom-call.7": attention}) == "ChunkKernel"  # any variant
    assert device_trace.kernel_key(combine, {}) == "CombineKernel"
    fusion = kernel_categories.Instruction("fusion", "jit(g)/mla_project/concatenate", "", ("concatenate", "convert"))
    # XLA's fusion names are per program: the instruction's scope and fused ops name the kernel.
    for name in ("input_concatenate_fusion", "input_concatenate_fusion_7"):
        kernel = device_trace.KernelTime(name, "f.1", 1e-6)
        assert device_trace.kernel_key(kernel, {"f.1": fusion}) == "fusion:jit(g)/mla_project/concatenate:concatenate.convert"


def test_the_kernels_beside_the_copy_and_their_slowdown(tmp_path):
    kernels = device_trace.device_kernels(str(_two_stream_trace(tmp_path)), module="m")
    # Both gemms overlap the copy on stream 9; the fetch kernel on stream 7 is the copy itself.
    assert device_trace.beside_copy(kernels, {}) == ["gemm_fusion_dot_3", "gemm_fusion_dot_4"]
    assert device_trace.beside_copy([k for k in kernels if "gemm" in k.kernel], {}) == []
    per_step = device_trace.kernel_seconds(kernels, {}, steps=2)
    assert per_step["gemm_fusion_dot_3"] == pytest.approx(50e-6) and per_step["FetchKernel"] == pytest.approx(65e-6)
    without = {"gemm_fusion_dot_3": 40e-6, "other": 1.0}
    found = device_trace.copy_slowdown(["gemm_fusion_dot_3", "gemm_fusion_dot_4"], per_step, without)
    assert found["kinds"] == 1 and found["seconds"] == pytest.approx(50e-6)
    assert found["baseline_seconds"] == pytest.approx(40e-6) and found["slowdown"] == pytest.approx(0.25)
    assert found["unmatched_seconds"] == pytest.approx(25e-6)  # dot_4 has no counterpart
    assert found["unmatched"] == ["gemm_fusion_dot_4"]
    assert device_trace.copy_slowdown([], per_step, without) is None
    # No kind found in both runs: nothing to compare, so no slowdown (not a "+0%").
    none = device_trace.copy_slowdown(["gemm_fusion_dot_4"], per_step, without)
    assert none["kinds"] == 0 and none["slowdown"] is None and none["unmatched"] == ["gemm_fusion_dot_4"]


def test_beside_copy_finds_every_overlap_a_walk_over_all_pairs_finds():
    """beside_copy bisects the copy's spans; the same answer as testing every (kernel, span) pair,
    on random kernels and copies of two streams, touching, nested and zero-length ones included."""
    import random

    rng = random.Random(7)
    for _ in range(50):
        copies = [device_trace.KernelTime("FetchKernel<int4>", "", rng.choice([0.0, 1.0, 2.0, 5.0]) * 1e-6,
                                          start=rng.randrange(0, 60) * 1e-6, stream=rng.choice("89"))
                  for _ in range(rng.randrange(1, 6))]
        others = [device_trace.KernelTime(f"k{i}", "", rng.choice([0.0, 1.0, 3.0, 20.0]) * 1e-6,
                                          start=rng.randrange(0, 60) * 1e-6, stream=rng.choice("789"))
                  for i in range(12)]
        want = set()
        for k in others:
            for c in copies:
                if c.stream != k.stream and min(c.start + c.seconds, k.start + k.seconds) > max(c.start, k.start):
                    want.add(k.kernel)
        assert device_trace.beside_copy(copies + others, {}) == sorted(want)


def test_resolve_beside_the_copy_is_no_slowdown_to_count():
    """RESOLVE's probe beside a group's copy is not compared with the run without prefetch, whose
    RESOLVE did the copy itself."""
    copy = device_trace.KernelTime("FetchKernel<int4>", "", 100e-6, start=0.0, stream="9")
    probe = device_trace.KernelTime("void hisparse::(anonymous namespace)::ResolveKernel<1024, 4, 2>(Args)", "",
                                    10e-6, start=20e-6, stream="7")
    attention = device_trace.KernelTime("void hisparse::(anonymous namespace)::ChunkKernel<2, false>(Args)", "",
                                        40e-6, start=40e-6, stream="7")
    assert device_trace.beside_copy([copy, probe, attention], {}) == ["ChunkKernel"]
