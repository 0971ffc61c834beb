"""A kernel's machine code by source line, without a GPU: where its instructions come from.

    cuobjdump -xelf all BINARY                        # the cubins of a build (e.g. build/sparse_attention_bench)
    nvdisasm --print-line-info CUBIN > LISTING.sass   # the build must have -lineinfo (ffi/bench's Makefile does)
    python benchmarks/sass_lines.py LISTING.sass --kernel ChunkKernelILi4ELb0 --loops
    python benchmarks/sass_lines.py LISTING.sass --kernel ChunkKernelILi4ELb0 \\
        --from 0x35f0 --to 0xc440 --repeat 0x5cd0:0x6730:2 [--top 40]

Counts the instructions of one kernel (the one function whose mangled name holds --kernel) in an
address range [--from, --to) (default: the whole kernel), by source line and by opcode. The count
is static: both sides of a branch count, and a loop's body counts once unless a --repeat range
says how many times it runs per pass of the counted range (a loop unrolled by half runs twice).
--loops lists the backward branches (the loops' back edges) to find those ranges. What
BENCHMARKS.md quotes as a kernel's instruction mix when no GPU was there to profile it; Nsight
Compute's executed counts (ncu_stalls.py) replace it where one was.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

from hisparse_jax.bench.errors import BenchError
from hisparse_jax.bench.user_files import read_bounded_text

# script_checks.py sits beside this script (importable when it is run and when a test loads it).
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_checks import one_line_errors  # noqa: E402

_MAX_BYTES = 512 << 20  # a cubin's whole listing: tens of MB for the largest kernels here
_MAX_SOURCE_BYTES = 16 << 20
_WANTED = "the output of `nvdisasm --print-line-info CUBIN` (a cubin built with -lineinfo)"
_LABEL = re.compile(r"^([A-Za-z_$.][\w$.]*):\s*$")
_LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(.+?)\s*;")
# A branch's target: an address (cuobjdump) or a local label (nvdisasm: `(.L_x_12)).
_BRANCH = re.compile(r"\bBRA(?:\.[A-Z.]+)?\s+(?:`\((\.L\w+)\)|0x([0-9a-f]+))")
_ADDRESS_LIMIT = 1 << 40


def _address(text: str, what: str) -> int:
    """A code address, hexadecimal (0x...) or decimal, in [0, 2^40); ValueError naming `what`."""
    try:
        value = int(text, 16) if text.lower().startswith("0x") else int(text, 10)
    except ValueError:
        raise ValueError(f"{what} is {text!r}, not an address (0x35f0 or 13808)") from None
    if not 0 <= value < _ADDRESS_LIMIT:
        raise ValueError(f"{what} is {text!r}, outside [0, 2^40)")
    return value


def read_kernel(path: str, name: str) -> tuple[str, list[tuple[int, str, tuple[str, int] | None]], dict[str, int]]:
    """(the kernel's mangled name, its instructions as (address, text, (file, line) or None), its
    local labels' addresses) of the one function in the listing whose name holds `name`;
    BenchError if none or several do."""
    lines = read_bounded_text(path, _MAX_BYTES, _WANTED).splitlines()
    labels = [(i, m.group(1)) for i, line in enumerate(lines) if (m := _LABEL.match(line))]
    functions = [(i, label) for i, label in labels if not label.startswith((".", "$")) and name in label]
    if not functions:
        raise BenchError(f"{path}: no function whose name holds {name!r}; pass --kernel a piece of one of its "
                         f"{sum(1 for _, label in labels if not label.startswith(('.', '$')))} function names, "
                         f"and {_WANTED}")
    if len(functions) > 1:
        shown = ", ".join(label for _, label in functions[:4])
        raise BenchError(f"{path}: {len(functions)} functions hold {name!r} ({shown}{', ...' if len(functions) > 4 else ''}); "
                         "pass --kernel a longer piece of one name")
    start, kernel = functions[0]
    out, where, labels, pending = [], None, {}, []
    for line in lines[start + 1:]:
        if line.startswith("//---") or line.lstrip().startswith(".section"):
            break  # the next section: the function ended
        if m := _LINE.search(line):
            where = (m.group(1), int(m.group(2)))
        elif m := _INSTRUCTION.match(line):
            address = int(m.group(1), 16)
            labels.update((label, address) for label in pending)
            pending = []
            out.append((address, m.group(2), where))
        elif (m := _LABEL.match(line)) and m.group(1).startswith("."):
            pending.append(m.group(1))  # a local label: the next instruction's address
    if not out:
        raise BenchError(f"{path}: function {kernel} has no instructions; pass {_WANTED}")
    return kernel, out, labels


def opcode(text: str) -> str:
    """The instruction's opcode without its predicate and modifiers: '@!P0 BRA 0x10' -> 'BRA'."""
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def backward_branches(code, labels: dict[str, int]) -> list[tuple[int, int, int]]:
    """(branch address, target, instructions from target to branch) of every branch to an earlier
    address: a loop's back edge, its body between the two."""
    out = []
    for address, text, _ in code:
        m = _BRANCH.search(text)
        target = None if not m else labels.get(m.group(1)) if m.group(1) else int(m.group(2), 16)
        if target is not None and target <= address:
            out.append((address, target, sum(1 for a, _, _ in code if target <= a <= address)))
    return out


def weights(code, lo: int, hi: int, repeats: list[tuple[int, int, int]]) -> list[int]:
    """How many times each instruction counts: 0 outside [lo, hi), else the product of the
    multipliers of the --repeat ranges holding it (1 if none)."""
    out = []
    for address, _, _ in code:
        w = int(lo <= address < hi)
        for r_lo, r_hi, times in repeats:
            if r_lo <= address < r_hi:
                w *= times
        out.append(w)
    return out


def _source_line(path: str, line: int, cache: dict) -> str:
    """The text of `line` of the source file at `path`, or "" when it cannot be read (the listing
    may come from another machine)."""
    if path not in cache:
        try:
            cache[path] = read_bounded_text(path, _MAX_SOURCE_BYTES, "a source file").splitlines()
        except BenchError:
            cache[path] = []
    text = cache[path]
    return text[line - 1].strip() if 0 < line <= len(text) else ""


def _repeat(text: str) -> tuple[int, int, int]:
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"--repeat is {text!r}, not FROM:TO:TIMES (e.g. 0x5cd0:0x6730:2)")
    lo, hi = _address(parts[0], "--repeat's FROM"), _address(parts[1], "--repeat's TO")
    try:
        times = int(parts[2], 10)
    except ValueError:
        times = -1
    if not 1 <= times <= 1_000_000:
        raise ValueError(f"--repeat's TIMES is {parts[2]!r}, not an integer in [1, 1000000]")
    if lo >= hi:
        raise ValueError(f"--repeat {text!r}: FROM must be below TO")
    return lo, hi, times


def main(argv: list[str] | None = None) -> int:
    p = one_line_errors(argparse.ArgumentParser(prog="sass_lines.py", description=__doc__.split("\n\n")[0]))
    p.add_argument("listing", help="nvdisasm --print-line-info CUBIN, saved to a file")
    p.add_argument("--kernel", required=True, help="a piece of the kernel's mangled name (exactly one must hold it)")
    p.add_argument("--from", dest="lo", default="0", help="first address counted (default: the kernel's start)")
    p.add_argument("--to", dest="hi", default=None, help="address past the last one counted (default: its end)")
    p.add_argument("--repeat", action="append", default=[], metavar="FROM:TO:TIMES",
                   help="instructions in [FROM, TO) count TIMES times (a loop body run TIMES times a pass)")
    p.add_argument("--top", type=int, default=40, help="source lines to list, by their instructions")
    p.add_argument("--loops", action="store_true", help="list the backward branches (loop back edges) first")
    a = p.parse_args(argv)
    try:
        if not 0 <= a.top <= 100_000:
            raise ValueError(f"--top must be an integer in [0, 100000], got {a.top}")
        lo = _address(a.lo, "--from")
        hi = _ADDRESS_LIMIT if a.hi is None else _address(a.hi, "--to")
        if lo >= hi:
            raise ValueError(f"--from {a.lo} must be below --to {a.hi}")
        repeats = [_repeat(r) for r in a.repeat]
    except ValueError as err:
        p.error(str(err))
    try:
        kernel, code, labels = read_kernel(a.listing, a.kernel)
    except BenchError as err:
        print(f"sass_lines: error: {err}", file=sys.stderr)
        return 2
    w = weights(code, lo, hi, repeats)
    total = sum(w)
    span = f"[{lo:#x}, {'end' if a.hi is None else hex(hi)})"
    if total == 0:
        print(f"sass_lines: error: no instruction of {kernel} in {span}; its code spans 0x0-{code[-1][0]:#x}",
              file=sys.stderr)
        return 2
    reps = "".join(f", [{r_lo:#x}, {r_hi:#x}) x{n}" for r_lo, r_hi, n in repeats)
    print(f"{kernel}: {total} instructions counted in {span}{reps} ({len(code)} in the kernel)")
    if a.loops:
        print("backward branches (loop back edges): branch -> target, instructions between")
        for branch, target, n in backward_branches(code, labels):
            print(f"  {branch:#x} -> {target:#x}  {n}")
    ops = collections.Counter()
    by_line = collections.Counter()
    line_ops = collections.defaultdict(collections.Counter)
    for (_, text, where), n in zip(code, w):
        if n:
            ops[opcode(text)] += n
            by_line[where] += n
            line_ops[where][opcode(text)] += n
    print("by opcode: " + ", ".join(f"{o} {n} ({100 * n / total:.1f}%)" for o, n in ops.most_common(16)))
    print("by source line: instructions, share, file:line, main opcodes, the line")
    cache: dict = {}
    for where, n in by_line.most_common(a.top):
        file, line = where if where else ("?", 0)
        main_ops = ", ".join(f"{o} {k}" for o, k in line_ops[where].most_common(3))
        src = _source_line(file, line, cache) if where else ""
        print(f"  {n:6d} {100 * n / total:5.1f}%  {os.path.basename(file)}:{line}  [{main_ops}]  {src[:80]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
