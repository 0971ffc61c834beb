"""Does XLA capture RESOLVE into CUDA graphs (command buffers) inside a jitted scan?

Runs a decode-shaped program (lax.scan over steps around lax.scan over layers,
RESOLVE per layer plus a gather from the hot buffer, cache donated) once per
configuration, each in its own subprocess with its own XLA_FLAGS, XLA dumps and
XLA verbose logs, and prints one JSON object with, per configuration:

  thunks   where the RESOLVE kCustomCall sits in the thunk tree XLA executes.
           That tree is *.thunk_sequence_after_thunk_passes.txt: command buffers
           are made by a thunk pass (CommandBufferConversionPass, run in
           GpuExecutable::Create) *after* *.thunk_sequence.txt is written, and
           the after-passes file exists only when a pass changed the tree (no
           such file: nothing was converted). RESOLVE is captured when a
           kCommandBuffer thunk encloses its kCustomCall.
  runtime  counts of XLA's own log lines per phase (compile, run1 = first call,
           run2 = second call): "Execute command buffer" (a graph launch, from
           command_buffer_thunk.cc), record/update lines, "FFI handler requested
           or required fallback to stream capture" (custom_call_thunk.cc: a
           custom call recorded into a graph by stream capture), host-driven
           while loops (while_thunk.cc) and dynamic-slice fusions run as plain
           thunks (dynamic_slice_fusion_v2_thunk.cc).
  conversion_log  what command_buffer_conversion_pass.cc says about the module:
           the enabled command types and why thunks were (not) converted.
  misses_per_step  RESOLVE's misses per decode step, first and second call:
           equal in every configuration and to the pure-JAX reference.
  effective_debug_options  the command-buffer options XLA compiles with (its
           defaults plus XLA_FLAGS), read back from jax's CompileOptions.

Configurations: XLA's defaults; the minimum graph size at 1; WHILE and
CONDITIONAL enabled; the same with --xla_gpu_command_buffer_unroll_loops (the
conversion pass refuses a while loop whose body holds a loop-dependent
dynamic-slice fusion unless it may unroll it); dynamic-slice fusion disabled;
and a program variant whose selection is computed inside the layer loop (as in
the real models) instead of sliced from a stacked input, so no dynamic-slice
fusion forms around RESOLVE. Extra XLA flags in XLA_FLAGS apply to every
configuration. XLA:CPU has no command buffers: there the script runs one
configuration per program variant and only checks that they run and agree.

Each configuration's dumps and full stderr stay in the "dump" directory it reports
(child_stderr.log). Expect roughly 10-15 s per configuration on an H200; past
--budget seconds the remaining configurations are skipped.

  python benchmarks/check_command_buffer.py [--configs default,while_unroll] [--budget 120]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

MODULE = "jit_decode_like"  # the jitted program's XLA module name
L, BATCH, STEPS, R, B, K = 4, 8, 3, 4096, 512, 256

_BODY = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION"
_WHILE = [f"--xla_gpu_enable_command_buffer={_BODY},CONDITIONAL,WHILE", "--xla_gpu_graph_min_graph_size=1"]
_UNROLL = ["--xla_gpu_command_buffer_unroll_loops=true"]
# name: (XLA flags, program variant, what it tells)
CONFIGS = {  # in order of interest: the time budget skips the last ones first
    "default": ([], "sliced", "XLA's default command types and minimum graph size"),
    "while": (_WHILE, "sliced", "WHILE and CONDITIONAL enabled, minimum graph size 1"),
    "while_unroll": (_WHILE + _UNROLL, "sliced", "as while, loops with known trip counts may be unrolled"),
    "computed_sel": (_WHILE, "computed", "as while, selection computed in the layer loop (no slice)"),
    "computed_sel_unroll": (_WHILE + _UNROLL, "computed", "as while_unroll, selection computed in the loop"),
    "no_dsf": (_WHILE + ["--xla_gpu_enable_dynamic_slice_fusion=false"], "sliced",
               "as while, dynamic-slice fusion disabled"),
    "min1": (["--xla_gpu_graph_min_graph_size=1"], "sliced", "defaults, minimum graph size 1"),
}
VMODULE = ("command_buffer_thunk=3,command_buffer_conversion_pass=2,custom_call_thunk=3,"
           "while_thunk=2,dynamic_slice_fusion_v2_thunk=3")
RESULT, PHASE = "@@RESULT ", "@@PHASE "
# DebugOptions fields (xla/xla.proto numbers) and enum names, to report what XLA will compile with.
_FIELDS = {258: "xla_gpu_enable_command_buffer", 208: "xla_gpu_graph_min_graph_size",
           105: "xla_gpu_enable_dynamic_slice_fusion", 411: "xla_gpu_command_buffer_unroll_loops",
           404: "xla_gpu_command_buffer_scheduling_mode", 311: "xla_cmd_buffer_trace_cache_size",
           317: "xla_enable_command_buffers_during_profiling"}
_CMD_TYPES = ["INVALID", "FUSION", "CUBLAS", "CUDNN", "COLLECTIVES", "CONDITIONAL", "WHILE", "CUSTOM_CALL",
              "CUBLASLT", "DYNAMIC_SLICE_FUSION", "DYNAMIC_SLICE_COPY_FUSION"]
_SCHEDULING = ["SERIALIZE", "CONCURRENT", "LHS", "CONCURRENT_REGIONS"]
# Runtime evidence: XLA log messages (matched on the message, after the log prefix).
RUNTIME = {
    "graph_launches": r"Execute command buffer(?! thunk as a regular)",
    "graph_records_or_updates": r"(Create/Update|Update|Recording) command buffer",
    "graph_initializations": r"(?<!skip )Initialize command buffer on device",
    "graph_warmups": r"Executing warm up iteration of command buffer thunk",
    "graph_disabled_by_profiler": r"Execute command buffer thunk as a regular thunk sequence",
    "custom_call_recorded_by_capture": r"FFI handler requested or required fallback to stream capture",
    "while_loops_run_by_host": r"Executing WhileThunk (for|condition)",
    "dynamic_slice_fusions_run_by_host": r"Dynamic slice fusion: \d+ parameters",
}
_LOG = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ ([\w.\-]+):\d+\] ?(.*)$")
_KIND = re.compile(r"^(\s*)(?:\d+:\s*)?(k[A-Z]\w*)")


# ----------------------------------------------------------------------------- child


def _varint(b: bytes, i: int) -> tuple[int, int]:
    x = shift = 0
    while True:
        c = b[i]
        i += 1
        x |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return x, i


def _varints(b: bytes) -> list[int]:
    """A packed repeated varint field."""
    out, i = [], 0
    while i < len(b):
        v, i = _varint(b, i)
        out.append(v)
    return out


def _proto_fields(b: bytes) -> dict[int, list]:
    """A protobuf message's fields by number (wire format only; no schema needed)."""
    out, i = {}, 0
    while i < len(b):
        key, i = _varint(b, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(b, i)
        elif wire == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            v, i = b[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wire}")
        out.setdefault(field, []).append(v)
    return out


def _effective_debug_options() -> dict:
    """Command-buffer options XLA compiles with here: its defaults plus XLA_FLAGS.

    jax compiles with xla_client.CompileOptions(), whose debug options come from
    GetDebugOptionsFromFlags(); they are read back from the serialized proto
    (CompileOptionsProto.executable_build_options = 3, .debug_options = 3).
    """
    from jax._src.lib import xla_client

    options = xla_client.CompileOptions()
    options.executable_build_options.debug_options  # noqa: B018  (materializes them from the flags)
    debug = _proto_fields(_proto_fields(_proto_fields(options.SerializeAsString())[3][0])[3][0])
    out = {}
    for number, name in _FIELDS.items():
        values = debug.get(number)
        if number == 258:
            ids = [x for v in values or [] for x in (_varints(v) if isinstance(v, bytes) else [v])]
            out[name] = ",".join(_CMD_TYPES[i] if i < len(_CMD_TYPES) else f"#{i}" for i in ids)
        elif number == 404:
            mode = values[-1] if values else 0
            out[name] = _SCHEDULING[mode] if mode < len(_SCHEDULING) else f"#{mode}"
        elif number in (105, 411, 317):
            out[name] = bool(values[-1]) if values else False
        else:
            out[name] = values[-1] if values else 0
    return out


def _selection(base, step, layer):
    """The ids layer `layer` selects at decode step `step`: both program variants use it."""
    return (base + layer * 977 + step * 131) % R


def _program(pool, sealed, implementation: str):
    """The jitted decode-shaped program: steps x layers of RESOLVE in nested scans, cache donated;
    the ids come in as an argument ("sliced") or from device math in the loop body (None)."""
    import jax
    import jax.numpy as jnp

    import hisparse_jax as hs

    def decode_like(cache, sels, base):
        def step(cache, xs):
            s, sel_step = xs

            def layer(cache, ys):
                l, sel = ys
                if sel is None:  # "computed": the ids come from device math in the loop body
                    sel = _selection(base, s, l)
                res, cache = hs.resolve(cache, pool, sel, sealed, l, implementation=implementation)
                records = jnp.take_along_axis(cache.hot[l], res.slots[..., None, None], axis=1)
                return cache, (records.astype(jnp.float32).sum(), res.misses.sum())

            return jax.lax.scan(layer, cache, (jnp.arange(L, dtype=jnp.int32), sel_step))

        return jax.lax.scan(step, cache, (jnp.arange(STEPS, dtype=jnp.int32), sels))

    if implementation == "reference":  # a different module name: the dumps hold the FFI program only
        def decode_like_reference(cache, sels, base):
            return decode_like(cache, sels, base)
        return jax.jit(decode_like_reference, donate_argnums=0)
    return jax.jit(decode_like, donate_argnums=0)


def _environment() -> dict:
    """The child's backend, versions and the debug options XLA will compile with."""
    import jax

    import hisparse_jax as hs

    out = dict(backend=jax.default_backend(), jax=jax.__version__, device=str(jax.devices()[0]),
               device_kind=jax.devices()[0].device_kind, ffi=list(hs.ffi_platforms()))
    try:
        import jaxlib
        out["jaxlib"] = jaxlib.__version__
    except Exception:  # noqa: BLE001  (informational only)
        pass
    try:
        out["effective_debug_options"] = _effective_debug_options()
    except Exception as err:  # noqa: BLE001  (a private API: report, do not fail)
        out["effective_debug_options"] = f"unavailable: {type(err).__name__}: {err}"
    return out


def _child(variant: str, reference: bool) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import hisparse_jax as hs

    def phase(name):
        sys.stderr.write(f"{PHASE}{name}\n")
        sys.stderr.flush()

    cfg = hs.CacheConfig(num_layers=L, stream_shape=(BATCH,), pool_records=R, hot_slots=B, top_k=K,
                         record_width=576, dtype=jnp.bfloat16)
    rng = np.random.default_rng(0)
    pool = hs.write_records_inplace(
        hs.alloc_host_pool(cfg),
        jnp.asarray(rng.standard_normal((L, BATCH, R, 1, 576)), jnp.bfloat16),
        jnp.zeros(BATCH, jnp.int32),
    )
    base_np = rng.integers(0, R, (BATCH, K)).astype(np.int32)
    base = jnp.asarray(base_np)
    sealed = jnp.full((BATCH,), R, jnp.int32)
    sliced = np.stack([np.stack([_selection(base_np, s, l) for l in range(L)]) for s in range(STEPS)])

    sels = jnp.asarray(sliced) if variant == "sliced" else None
    out = _environment()

    phase("compile")
    t0 = time.perf_counter()
    cache = hs.init_hot_cache(cfg)
    compiled = _program(pool, sealed, "ffi").lower(cache, sels, base).compile()
    out["compile_s"] = round(time.perf_counter() - t0, 3)
    for run in ("run1", "run2"):
        phase(run)
        t0 = time.perf_counter()
        cache, (sums, misses) = compiled(cache, sels, base)
        jax.block_until_ready((cache, sums, misses))
        out[f"{run}_s"] = round(time.perf_counter() - t0, 4)
        out[f"misses_per_step_{run}"] = np.asarray(misses).sum(axis=1).tolist()
        out[f"records_checksum_{run}"] = float(np.asarray(sums, np.float64).sum())
    phase("end")

    if reference:  # pure JAX on a device copy of the pool: the expected misses
        dev_pool = jax.device_put(pool, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
        ref = _program(dev_pool, sealed, "reference")
        cache = hs.init_hot_cache(cfg)
        for run in ("run1", "run2"):
            cache, (_, misses) = ref(cache, jnp.asarray(sliced), base)
            out[f"reference_misses_per_step_{run}"] = np.asarray(misses).sum(axis=1).tolist()
    print(RESULT + json.dumps(out), flush=True)


# ----------------------------------------------------------------------------- parent


def _latest(pattern: str) -> str | None:
    paths = sorted(glob.glob(pattern))
    return paths[-1] if paths else None


def _thunk_tree(path: str) -> list[tuple[int, str, str, str]]:
    """(depth, kind, line, label) of every thunk line; depth is the line's indentation,
    label "cond:"/"body:" marks the first thunk of a while loop's condition or body."""
    rows, label = [], ""
    for line in open(path, errors="replace").read().splitlines():
        m = _KIND.match(line)
        if m:
            rows.append((len(m.group(1)), m.group(2), line.strip(), label))
            label = ""
        elif line.strip() in ("condition:", "body:"):
            label = {"condition:": "cond:", "body:": "body:"}[line.strip()]
    return rows


def _outline(rows, limit=700) -> str:
    """The thunk tree as nested kinds, runs of equal siblings collapsed: kWhile[kKernel x3, ...]."""

    def build(i, depth):
        items = []
        while i < len(rows) and rows[i][0] >= depth:
            d, kind, _, label = rows[i]
            i += 1
            children, i = build(i, d + 1) if i < len(rows) and rows[i][0] > d else ([], i)
            items.append(label + kind + (f"[{', '.join(children)}]" if children else ""))
        merged = []
        for it in items:
            if merged and merged[-1][0] == it:
                merged[-1][1] += 1
            else:
                merged.append([it, 1])
        return [it if n == 1 else f"{it} x{n}" for it, n in merged], i

    text = ", ".join(build(0, 0)[0]) if rows else ""
    return text if len(text) <= limit else text[:limit] + " ..."


def _thunks(dump: str) -> dict:
    after = _latest(f"{dump}/*.{MODULE}.thunk_sequence_after_thunk_passes.txt")
    before = _latest(f"{dump}/*.{MODULE}.thunk_sequence.txt")
    if after is None and before is None:
        return dict(file=None, note="no thunk_sequence dump for this module (XLA:CPU writes none, "
                                    "and none is written when compilation fails)")
    path = after or before
    rows = _thunk_tree(path)
    stack, paths, loops_in_cb = [], [], []
    for depth, kind, line, _ in rows:
        while stack and stack[-1][0] >= depth:
            stack.pop()
        enclosing = [k for _, k in stack]
        if kind == "kCustomCall":
            paths.append(dict(path=" > ".join(enclosing + [kind]), line=line[:200],
                              in_command_buffer="kCommandBuffer" in enclosing))
        if kind == "kWhile":
            loops_in_cb.append("kCommandBuffer" in enclosing)
        stack.append((depth, kind))
    kinds = collections.Counter(k for _, k, _, _ in rows)
    return dict(
        file=os.path.basename(path),
        thunk_passes_changed_the_tree=after is not None,
        command_buffer_thunks=kinds.get("kCommandBuffer", 0),
        thunk_kinds=dict(sorted(kinds.items())),
        resolve=paths,
        resolve_in_command_buffer=bool(paths) and all(p["in_command_buffer"] for p in paths),
        while_loops_in_command_buffer=f"{sum(loops_in_cb)} of {len(loops_in_cb)}",
        outline=_outline(rows),
    )


def _hlo(dump: str) -> dict:
    """Where the custom call sits in the optimized HLO (e.g. inside a dynamic-slice fusion)."""
    path = _latest(f"{dump}/*.{MODULE}.*after_optimizations.txt")
    if path is None:
        return dict(file=None)
    from hisparse_jax import hlo  # here, not at the top: the parent process imports no jax

    module = hlo.parse(open(path, errors="replace").read())
    homes = [name for name, insts in module.computations.items() if any(i.target == "hisparse_resolve" for i in insts)]
    callers = [i.line.strip() for home in homes for i in module.callers_of(home)]  # the fusion, while or call

    def wrapper(line):
        op = re.search(r"\b(fusion|while|call|conditional|async-start)\(", line)
        tags = re.findall(r'kind=(\w+)|"kind":"(\w+)"|"name":"([\w.\-]+)"', line)
        return " ".join([op.group(1) if op else "?"] + [t for tup in tags for t in tup if t])

    return dict(file=os.path.basename(path),
                resolve_calls=module.count_target("hisparse_resolve"),
                resolve_in_computation=homes, wrapped_by=[wrapper(c) for c in callers][:4],
                called_by=[c[:240] for c in callers][:4],
                command_buffer_computations=sum("command_buffer" in name for name in module.computations))


def _debug_options(dump: str) -> list[str]:
    """The non-default debug options XLA compiled the module with (proof the flags arrived)."""
    path = _latest(f"{dump}/*.{MODULE}.debug_options")
    if path is None:
        return []
    keep = re.compile(r"command_buffer|graph_min|dynamic_slice|unroll")
    return [ln.strip() for ln in open(path, errors="replace") if keep.search(ln.split(":", 1)[0])]


def _logs(stderr: str) -> tuple[dict, list, list]:
    counts = {p: collections.Counter() for p in ("compile", "run1", "run2", "end")}
    conversion = collections.Counter()
    errors = []
    phase = "startup"
    for raw in stderr.splitlines():
        if raw.startswith(PHASE):
            phase = raw[len(PHASE):].strip()
            continue
        m = _LOG.match(raw)
        src, msg = (m.group(1), m.group(2)) if m else ("", raw)
        if phase in counts:
            for key, pat in RUNTIME.items():
                if re.search(pat, msg):
                    counts[phase][key] += 1
        if src.startswith("command_buffer_conversion_pass") and " graph: " not in msg:
            conversion[msg[:300]] += 1
        if raw.startswith(("E", "F")) and m or "Traceback" in raw or "Error" in raw[:40]:
            errors.append(raw[:300])
    runtime = {p: dict(c) for p, c in counts.items() if p != "end"}
    log = [f"{n}x {msg}" if n > 1 else msg for msg, n in conversion.most_common(14)]
    return runtime, log, errors[-6:]


def _verdict(res: dict) -> str:
    if not res.get("ok"):
        return "error: " + (res.get("error") or "child failed")
    if res.get("backend") != "gpu":
        return f"n/a: backend {res.get('backend')} has no command buffers (XLA:GPU only)"
    th, run2 = res["thunks"], res["runtime"].get("run2", {})
    launches = run2.get("graph_launches", 0)
    if not th.get("file"):
        return "unknown: no thunk dump found"
    if not th["resolve"]:
        return f"unknown: no kCustomCall line in {th['file']}"
    if th["resolve_in_command_buffer"]:
        loops = th["while_loops_in_command_buffer"]
        if launches:
            return (f"RESOLVE captured: its kCustomCall is inside a kCommandBuffer; {launches} graph "
                    f"launches in the second call; while loops in a command buffer: {loops}")
        return ("RESOLVE inside a kCommandBuffer in the thunk tree, but no graph launch was logged "
                "(check that TF_CPP_VMODULE logging reaches stderr)")
    reasons = ("not convertible", "not enabled", "min graph size", "Unsupported thunk",
               "Removed command buffer")
    why = [ln for ln in res.get("conversion_log", []) if any(r in ln for r in reasons)]
    return ("RESOLVE not captured" + (f" ({launches} launches of other graphs)" if launches else "")
            + (f"; conversion pass: {why[0][:200]}" if why else ""))


def _run_config(name: str, flags: list[str], variant: str, reference: bool, timeout: float) -> dict:
    dump = tempfile.mkdtemp(prefix=f"hisparse-cb-{name}-")
    xla_flags = " ".join([os.environ.get("XLA_FLAGS", ""), *flags, f"--xla_dump_to={dump}",
                          f"--xla_dump_hlo_module_re=^{MODULE}$"]).strip()
    env = dict(os.environ, XLA_FLAGS=xla_flags, TF_CPP_MIN_LOG_LEVEL="0",
               TF_CPP_VMODULE=",".join(filter(None, [os.environ.get("TF_CPP_VMODULE"), VMODULE])))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", variant]
    cmd += ["--reference"] if reference else []
    t0 = time.perf_counter()
    res = dict(xla_flags=" ".join(flags), program=variant, dump=dump)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as err:
        stdout = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        stderr = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else (err.stderr or "")
        rc = f"timeout after {timeout:.0f} s"
    res["seconds"] = round(time.perf_counter() - t0, 1)
    with open(os.path.join(dump, "child_stderr.log"), "w") as f:  # the full logs, for a closer look
        f.write(stderr)
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT)]
    runtime, conversion, errors = _logs(stderr)
    if lines:
        res.update(ok=True, **json.loads(lines[-1][len(RESULT):]))
    else:
        tail = [ln for ln in stderr.splitlines() if ln.strip()][-8:]
        res.update(ok=False, error=f"exit {rc}: " + " | ".join(ln[:240] for ln in (errors or tail)))
    res.update(flags_seen_by_xla=_debug_options(dump), thunks=_thunks(dump), hlo=_hlo(dump),
               runtime=runtime, conversion_log=conversion)
    res["verdict"] = _verdict(res)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="comma-separated subset of " + ",".join(CONFIGS))
    ap.add_argument("--budget", type=float, default=120.0, help="seconds; later configurations are skipped")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per configuration")
    ap.add_argument("--child", choices=("sliced", "computed"), help=argparse.SUPPRESS)
    ap.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args.child, args.reference)

    names = [n for n in args.configs.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        ap.error(f"unknown configurations {unknown}; choose from {list(CONFIGS)}")
    start, results, backend, programs_run = time.perf_counter(), {}, None, set()
    for name in names:
        flags, variant, what = CONFIGS[name]
        if time.perf_counter() - start > args.budget:
            results[name] = dict(what=what, ok=False, verdict="skipped: over the time budget")
            continue
        if backend not in (None, "gpu") and variant in programs_run:  # flags only matter on XLA:GPU
            results[name] = dict(what=what, ok=False, verdict=f"skipped: backend {backend} has no "
                                 "command buffers; one configuration per program variant is enough")
            continue
        res = _run_config(name, flags, variant, reference=not programs_run, timeout=args.timeout)
        results[name] = dict(what=what, **res)
        backend, programs_run = backend or res.get("backend"), programs_run | {variant}

    ok = {n: r for n, r in results.items() if r.get("ok")}
    first = next(iter(ok.values()), {})
    expected = {run: first.get(f"reference_misses_per_step_{run}") for run in ("run1", "run2")}
    mismatched = [n for n, r in ok.items() for run in ("run1", "run2")
                  if expected[run] is not None and r.get(f"misses_per_step_{run}") != expected[run]]
    env_keys = ("backend", "jax", "jaxlib", "device", "device_kind", "ffi")
    environment = {k: first.get(k) for k in env_keys}
    for r in ok.values():  # said once, in "environment"
        for k in env_keys[1:]:
            r.pop(k, None)
    report = dict(
        environment=environment,
        program=dict(layers=L, steps=STEPS, streams=BATCH, pool_records=R, hot_slots=B, top_k=K,
                     graph_launches_per_call=f"{STEPS * L} = one graph per layer iteration (loops run by "
                                             "the host); 1 = the whole loop nest in one graph"),
        summary={n: r["verdict"] for n, r in results.items()},
        correctness=dict(
            reference_misses_per_step=expected,
            all_configurations_match_reference=bool(ok) and expected["run1"] is not None and not mismatched,
            mismatched=sorted(set(mismatched)),
        ),
        seconds=round(time.perf_counter() - start, 1),
        configs=results,
    )
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
