"""A reader of compiled HLO text (`jitted.lower(...).compile().as_text()`).

The checks of the compiled programs (hisparse_jax.testing, tests/test_compiled_program.py), the profiler's
map from kernels to model code (hisparse_jax.bench.device_trace) and the command-buffer check
(benchmarks/check_command_buffer.py) all read the same text: computations, their instructions
(name, result shape, opcode, operands, attributes), the custom-call targets, the memory space of
a shape (S(5): pinned host), the entry layout and its aliases, and the loops around a call.

The text format is XLA's own printer's: a computation starts at column 0 with
`[ENTRY ][%]name (parameters) -> shape {` and ends with `}`; an instruction is one indented line
`[ROOT ][%]name = SHAPE opcode(operands), attributes` where SHAPE may be a (tuple).
"""

from __future__ import annotations

import dataclasses
import functools
import re

import numpy as np

_COMPUTATION = re.compile(r"^(?:(ENTRY) )?%?([\w.\-]+) .*\{\s*$")
_DEFINITION = re.compile(r"^\s*(?:(ROOT) )?%?([\w.\-]+) = (.*)$")
# Attributes that name the computations an instruction runs.
_CALLED = re.compile(r"(?:body|condition|calls|to_apply|branch_computations)=(\{[^}]*\}|%?[\w.\-]+)")
HOST_MEMORY_SPACE = 5  # S(5): XLA's memory space of pinned host memory

_DTYPE_NAMES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float8_e4m3fn": "f8e4m3fn",
                "float8_e5m2": "f8e5m2", "int32": "s32", "int8": "s8", "uint8": "u8", "uint32": "u32",
                "int64": "s64", "bool": "pred"}


def split_shape(text: str) -> tuple[str, str, str]:
    """'SHAPE opcode(operands), attrs' -> (SHAPE, opcode, 'operands), attrs'); SHAPE may be a (tuple)."""
    if text.startswith("("):
        depth = 0
        for end, ch in enumerate(text):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                break
        shape, text = text[: end + 1], text[end + 1 :].lstrip()
    else:
        shape, _, text = text.partition(" ")
    opcode, _, rest = text.partition("(")
    return shape, opcode, rest


def dims(shape: str) -> tuple[int, ...]:
    """'f32[4,48,64]{2,1,0}' -> (4, 48, 64); () for a tuple shape."""
    m = re.match(r"^\w+\[([\d,]*)\]", shape)
    return tuple(int(d) for d in m.group(1).split(",") if d) if m else ()


def array_type(shape: str) -> str:
    """'f32[4,48]{1,0:S(5)}' -> 'f32[4,48]': the element type and dims without the layout."""
    return shape.split("{")[0]


def memory_space(shape: str) -> int:
    """The memory space of an array shape's layout: 5 in 'f32[4]{0:S(5)}', 0 (device) without S(n)."""
    m = re.search(r"\{[^}]*:S\((\d+)\)[^}]*\}", shape)
    return int(m.group(1)) if m else 0


def shape_text(shape, dtype) -> str:
    """The HLO spelling of an array type: ((3, 4), float32) -> 'f32[3,4]'."""
    return f"{_DTYPE_NAMES[np.dtype(dtype).name]}[{','.join(map(str, shape))}]"


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One HLO instruction line.

    name, shape (the result type with its layout), opcode; operands: the names in its operand list;
    rest: the text after `opcode(` (operands and attributes); computation: where it is; root:
    whether it is its computation's ROOT; line: the line itself."""

    name: str
    shape: str
    opcode: str
    operands: tuple[str, ...]
    rest: str
    computation: str
    root: bool
    line: str

    @property
    def target(self) -> str:
        """custom_call_target, or "" (not a custom call)."""
        m = re.search(r'custom_call_target="([^"]*)"', self.rest)
        return m.group(1) if m else ""

    @property
    def scope(self) -> str:
        """The op_name metadata: the named scope of the model code it came from, or ""."""
        m = re.search(r'op_name="([^"]*)"', self.rest)
        return m.group(1) if m else ""

    @property
    def fusion_body(self) -> str | None:
        """The computation a fusion (or call) runs: its `calls=`, or None."""
        m = re.search(r"calls=%?([\w.\-]+)", self.rest)
        return m.group(1) if m else None

    @property
    def called(self) -> set[str]:
        """Every computation it runs (bodies, conditions, calls, to_apply, branches)."""
        return {c.lstrip("%") for group in _CALLED.findall(self.rest) for c in re.findall(r"%?[\w.\-]+", group)}

    @property
    def trip_count(self) -> int | None:
        """A while's known trip count (backend config), or None."""
        m = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', self.rest)
        return int(m.group(1)) if m else None


def _instruction(line: str, computation: str) -> Instruction | None:
    m = _DEFINITION.match(line)
    if not m:
        return None
    shape, opcode, rest = split_shape(m.group(3))
    operands = tuple(re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0]))
    return Instruction(m.group(2), shape, opcode, operands, rest, computation, bool(m.group(1)), line)


class Module:
    """A compiled HLO module's text, split into computations of instructions."""

    def __init__(self, text: str):
        self.text = text
        self.header = text.splitlines()[0] if text else ""
        m = re.match(r"HloModule ([\w.\-]+)", self.header)
        self.name = m.group(1) if m else None
        self.computations: dict[str, list[Instruction]] = {}
        self.entry = None
        current = None
        for line in text.splitlines():
            head = _COMPUTATION.match(line)
            if head and not line.startswith(" "):
                current = head.group(2)
                self.computations[current] = []
                if head.group(1):
                    self.entry = current
            elif line.startswith("}"):
                current = None
            elif current is not None:
                inst = _instruction(line, current)
                if inst is not None:
                    self.computations[current].append(inst)

    @functools.cached_property
    def instructions(self) -> dict[str, Instruction]:
        """Instruction name -> Instruction, over every computation (names are unique in a module)."""
        return {i.name: i for insts in self.computations.values() for i in insts}

    def count_target(self, target: str, computation: str | None = None) -> int:
        """Custom calls of `target` in `computation` (None: the whole module): call sites, not executions."""
        insts = self.instructions.values() if computation is None else self.computations[computation]
        return sum(i.target == target for i in insts)

    # ------------------------------------------------------------------ the entry's signature

    def entry_layout(self) -> tuple[list[str], str]:
        """(parameter shapes with layouts, result layout text) of entry_computation_layout."""
        layout = re.search(r"entry_computation_layout=\{\((.*)\)->(.*)\}", self.header)
        if layout is None:
            raise ValueError("no entry_computation_layout in the module header")
        return re.findall(r"\w+\[[\d,]*\]\{[^}]*\}", layout.group(1)), layout.group(2)

    def aliased_parameters(self) -> set[int]:
        """Entry parameters whose buffer an output reuses (input_output_alias: donation)."""
        alias = re.search(r"input_output_alias=\{(.*?)\}, entry", self.header)
        return {int(p) for p in re.findall(r"\{[\d,]*\}: \((\d+),", alias.group(1))} if alias else set()

    # ------------------------------------------------------------------ control flow

    def whiles(self, computation: str) -> list[tuple[str, int | None]]:
        """(body computation, known trip count or None) of every while in `computation`."""
        return [(re.search(r"body=%?([\w.\-]+)", i.rest).group(1), i.trip_count)
                for i in self.computations[computation] if i.opcode == "while"]

    def callees(self, computation: str) -> list[str]:
        """Computations run once per execution of `computation` (calls, fusions, conditionals)."""
        return [c for i in self.computations[computation] if i.opcode != "while"
                for c in re.findall(r"(?:calls|to_apply|branch_computations)=\{?%?([\w.\-]+)", i.rest)]

    def executions(self, target: str, computation: str | None = None) -> int:
        """How many times the program runs custom call `target`: trip counts multiplied through the loops."""
        computation = computation or self.entry
        n = self.count_target(target, computation)
        n += sum(trips * self.executions(target, body) for body, trips in self._counted_whiles(computation))
        n += sum(self.executions(target, callee) for callee in self.callees(computation))
        return n

    def loop_nest_of(self, target: str) -> list[int] | None:
        """Trip counts of the loops around the (first) call site of `target`, outermost first."""

        def search(computation, trips):
            if self.count_target(target, computation):
                return trips
            for body, n in self._counted_whiles(computation):
                found = search(body, trips + [n])
                if found is not None:
                    return found
            for callee in self.callees(computation):
                found = search(callee, trips)
                if found is not None:
                    return found
            return None

        return search(self.entry, [])

    def _counted_whiles(self, computation: str) -> list[tuple[str, int]]:
        """whiles(), each with a known trip count (counting executions needs one)."""
        out = self.whiles(computation)
        unknown = [body for body, trips in out if trips is None]
        if unknown:
            raise ValueError(f"while with body {unknown[0]} has no known trip count")
        return out

    def loop_computations(self) -> set[str]:
        """Computations run inside the entry computation's while loops: their bodies and conditions
        and everything these call, transitively."""
        todo = {c for i in self.computations[self.entry] if i.opcode == "while" for c in i.called}
        seen = set()
        while todo:
            name = todo.pop()
            if name in seen or name not in self.computations:
                continue
            seen.add(name)
            todo |= {c for i in self.computations[name] for c in i.called}
        return seen

    def callers_of(self, computation: str) -> list[Instruction]:
        """Instructions that run `computation` (a fusion, while, call or conditional naming it)."""
        return [i for i in self.instructions.values() if computation in i.called]

    # ------------------------------------------------------------------ buffers

    def fusion_bodies(self) -> set[str]:
        """Computations that are fusions' bodies (what they compute stays in registers)."""
        return {i.fusion_body for i in self.instructions.values() if i.opcode == "fusion" and i.fusion_body}

    def root_opcode(self, computation: str) -> str | None:
        return next((i.opcode for i in self.computations.get(computation, ()) if i.root), None)

    def materialized(self, only: set[str] | None = None) -> list[tuple[str, str, str, str | None]]:
        """(name, shape, opcode, fusion root opcode) of every instruction that gets a buffer: those of
        every computation but fusion bodies; `only`: the computations to look in (None: all)."""
        fused = self.fusion_bodies()
        return [(i.name, i.shape, i.opcode, self.root_opcode(i.fusion_body) if i.fusion_body else None)
                for name, insts in self.computations.items()
                if name not in fused and (only is None or name in only) for i in insts]

    def ops_producing(self, shape: str) -> set[str]:
        """Opcodes of every instruction whose (array) result is exactly `shape` (no layout)."""
        return {i.opcode for i in self.instructions.values() if array_type(i.shape) == shape}

    def ops_consuming(self, shape: str) -> set[str]:
        """Opcodes of every instruction that takes an operand of exactly `shape` (no layout)."""
        typed = {i.name: array_type(i.shape) for i in self.instructions.values()}
        return {i.opcode for i in self.instructions.values() if any(typed.get(o) == shape for o in i.operands)}


def parse(text: str) -> Module:
    """The Module of compiled HLO text."""
    return Module(text)
