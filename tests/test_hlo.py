"""hisparse_jax.hlo, the reader of compiled HLO text: on small hand-written modules (every field
and the loop arithmetic, exactly) and on programs jax compiles here (what the compiled-program
checks rely on: loops with known trip counts, donation, fusions)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from hisparse_jax import hlo

SMALL = """\
HloModule jit_step, input_output_alias={ {0}: (0, {}, may-alias) }, entry_computation_layout={(f32[3,4]{1,0:S(5)}, s32[]{:T(128)})->(f32[3,4]{1,0:S(5)}, s32[])}

%fused_add (param_0: f32[3,4]) -> f32[3,4] {
  %param_0 = f32[3,4]{1,0} parameter(0)
  ROOT %add.1 = f32[3,4]{1,0} add(%param_0, %param_0)
}

%inner_body (p: (f32[3,4], s32[])) -> (f32[3,4], s32[]) {
  %p = (f32[3,4]{1,0:S(5)}, s32[]) parameter(0)
  %gte.0 = f32[3,4]{1,0:S(5)} get-tuple-element(%p), index=0
  %gte.1 = s32[] get-tuple-element(%p), index=1
  %call.7 = f32[3,4]{1,0:S(5)} custom-call(%gte.0, %gte.1), custom_call_target="hisparse_resolve", metadata={op_name="jit(step)/while/body/decode_step/attention/resolve"}
  ROOT %t = (f32[3,4]{1,0:S(5)}, s32[]) tuple(%call.7, %gte.1)
}

%inner_cond (p: (f32[3,4], s32[])) -> pred[] {
  %p.c = (f32[3,4]{1,0:S(5)}, s32[]) parameter(0)
  ROOT %lt = pred[] constant(true)
}

%outer_body (q: (f32[3,4], s32[])) -> (f32[3,4], s32[]) {
  %q = (f32[3,4]{1,0:S(5)}, s32[]) parameter(0)
  %w.in = (f32[3,4]{1,0:S(5)}, s32[]) while(%q), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"3"}}
  %g = f32[3,4]{1,0:S(5)} get-tuple-element(%w.in), index=0
  %fusion.2 = f32[3,4]{1,0} fusion(%g), kind=kLoop, calls=%fused_add
  %copy.3 = f32[3,4]{1,0} copy(%fusion.2)
  ROOT %r = (f32[3,4]{1,0:S(5)}, s32[]) tuple(%g, %gte.9)
}

%outer_cond (q: (f32[3,4], s32[])) -> pred[] {
  %q.c = (f32[3,4]{1,0:S(5)}, s32[]) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main.9 (Arg_0: f32[3,4], Arg_1: s32[]) -> (f32[3,4], s32[]) {
  %Arg_0 = f32[3,4]{1,0:S(5)} parameter(0)
  %Arg_1 = s32[] parameter(1)
  %init = (f32[3,4]{1,0:S(5)}, s32[]) tuple(%Arg_0, %Arg_1)
  ROOT %w.out = (f32[3,4]{1,0:S(5)}, s32[]) while(%init), condition=%outer_cond, body=%outer_body, backend_config={"known_trip_count":{"n":"7"}}
}
"""


def test_small_module_computations_and_instructions():
    m = hlo.parse(SMALL)
    assert m.name == "jit_step" and m.entry == "main.9"
    assert list(m.computations) == ["fused_add", "inner_body", "inner_cond", "outer_body", "outer_cond", "main.9"]
    call = m.instructions["call.7"]
    assert (call.shape, call.opcode, call.operands) == ("f32[3,4]{1,0:S(5)}", "custom-call", ("gte.0", "gte.1"))
    assert call.target == "hisparse_resolve" and call.computation == "inner_body" and not call.root
    assert call.scope == "jit(step)/while/body/decode_step/attention/resolve"
    assert m.instructions["add.1"].root and m.instructions["add.1"].target == "" and m.instructions["add.1"].scope == ""
    tup = m.instructions["w.out"]
    assert tup.shape == "(f32[3,4]{1,0:S(5)}, s32[])" and tup.opcode == "while" and tup.trip_count == 7
    assert tup.called == {"outer_cond", "outer_body"}
    assert m.instructions["fusion.2"].fusion_body == "fused_add"


def test_small_module_signature_loops_and_buffers():
    m = hlo.parse(SMALL)
    params, result = m.entry_layout()
    assert params == ["f32[3,4]{1,0:S(5)}", "s32[]{:T(128)}"] and result.startswith("(f32[3,4]{1,0:S(5)}")
    assert m.aliased_parameters() == {0}
    assert m.count_target("hisparse_resolve") == 1 and m.count_target("hisparse_resolve", "main.9") == 0
    assert m.whiles("main.9") == [("outer_body", 7)]
    assert m.callees("outer_body") == ["fused_add"]
    assert m.executions("hisparse_resolve") == 7 * 3
    assert m.loop_nest_of("hisparse_resolve") == [7, 3]
    assert m.loop_nest_of("hisparse_pool_write") is None
    assert m.loop_computations() == {"outer_body", "outer_cond", "inner_body", "inner_cond", "fused_add"}
    assert [c.name for c in m.callers_of("inner_body")] == ["w.in"]
    assert m.fusion_bodies() == {"fused_add"}
    assert m.root_opcode("fused_add") == "add"
    materialized = {name: (opcode, root) for name, _, opcode, root in m.materialized()}
    assert "add.1" not in materialized and materialized["fusion.2"] == ("fusion", "add")
    assert [name for name, *_ in m.materialized({"main.9"})] == ["Arg_0", "Arg_1", "init", "w.out"]
    assert m.ops_producing("f32[3,4]") == {"parameter", "get-tuple-element", "custom-call", "fusion", "copy", "add"}
    assert m.ops_consuming("f32[3,4]") == {"custom-call", "fusion", "copy", "tuple", "add"}


def test_unknown_trip_count_is_refused():
    text = SMALL.replace(', backend_config={"known_trip_count":{"n":"3"}}', "")
    m = hlo.parse(text)
    assert m.whiles("outer_body") == [("inner_body", None)]
    with pytest.raises(ValueError, match="no known trip count"):
        m.executions("hisparse_resolve")


@pytest.mark.parametrize("shape, dims, array, space", [
    ("f32[4,48,64]{2,1,0}", (4, 48, 64), "f32[4,48,64]", 0),
    ("bf16[3,2,16,1,2]{4,3,2,1,0:S(5)}", (3, 2, 16, 1, 2), "bf16[3,2,16,1,2]", 5),
    ("s32[]", (), "s32[]", 0),
    ("(f32[2]{0}, s32[])", (), "(f32[2]", 0),
])
def test_shape_helpers(shape, dims, array, space):
    assert hlo.dims(shape) == dims and hlo.array_type(shape) == array and hlo.memory_space(shape) == space


def test_split_shape_and_shape_text():
    assert hlo.split_shape("(f32[2]{0}, (s32[], u8[3]{0})) while(%x), body=%b") == (
        "(f32[2]{0}, (s32[], u8[3]{0}))", "while", "%x), body=%b")
    assert hlo.split_shape("f32[2]{0} add(%a, %b)") == ("f32[2]{0}", "add", "%a, %b)")
    assert hlo.shape_text((3, 4), np.float32) == "f32[3,4]"
    assert hlo.shape_text((2,), jnp.bfloat16) == "bf16[2]"
    assert hlo.shape_text((), np.int32) == "s32[]"


def test_a_compiled_scan_has_its_trip_count_and_donation():
    def steps(x, y):
        def body(carry, _):
            return jnp.sin(carry) * 2.0 + y, None

        return lax.scan(body, x, None, length=50)[0]

    x = jnp.ones((8, 16), jnp.float32)
    m = hlo.parse(jax.jit(steps, donate_argnums=0).lower(x, x).compile().as_text())
    assert m.entry is not None and m.name.startswith("jit_steps")
    loops = [(c, body, trips) for c in m.computations for body, trips in m.whiles(c)]
    assert [trips for *_, trips in loops] == [50]
    assert m.aliased_parameters() == {0}
    params, result = m.entry_layout()
    assert [hlo.array_type(p) for p in params] == ["f32[8,16]", "f32[8,16]"] and "f32[8,16]" in result
    if loops[0][0] == m.entry:
        assert loops[0][1] in m.loop_computations()
    assert m.instructions and all(i.name in m.instructions for c in m.computations.values() for i in c)
    # Every instruction the program materializes lies outside fusion bodies.
    assert not {name for name, *_ in m.materialized()} & {
        i.name for c in m.fusion_bodies() for i in m.computations[c]}


def test_a_compiled_program_with_pinned_host_memory():
    device = jax.local_devices()[0]
    try:
        host = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
        x = jax.device_put(jnp.ones((4, 8), jnp.float32), host)
    except (ValueError, RuntimeError, jax.errors.JaxRuntimeError):
        pytest.skip("no pinned_host memory on this backend")
    m = hlo.parse(jax.jit(lambda a: a, out_shardings=host).lower(x).compile().as_text())
    params, result = m.entry_layout()
    assert hlo.memory_space(params[0]) == hlo.HOST_MEMORY_SPACE
    assert ":S(5)" in result
