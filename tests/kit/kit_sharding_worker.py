"""Run by tests/kit/test_state_layout.py in a process of 2 CPU devices: a kit family sharded over
the batch (hisparse_jax.sharding reads the indexer metadata's declared layout) decodes each
stream as one device alone does. Prints one JSON line."""

import json

import jax
import jax.numpy as jnp
import numpy as np

from hisparse_jax import decode, kit
from hisparse_jax import sharding as hsh
from hisparse_jax.models.family import decode_weights

jax.config.update("jax_disable_most_optimizations", True)
family = kit.family(kit.PageMinMax(page=8, dim=16, heads=2))
config = family.Config.tiny(num_layers=2, top_k=8, hot_slots=10, max_context=64)
weights = decode_weights(family, config, family.init_weights(config, 0))  # the decode layout, replicated too
prompts = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 40)).astype(np.int32))
lengths = jnp.asarray([37, 20], jnp.int32)


def run(family, weights, prompts, lengths):
    state = family.init_state(config, prompts.shape[0], "hisparse")
    state, logits = decode.prefill(family, config, weights, state, prompts, lengths)
    out = decode.generate(family, config, weights, state, jnp.argmax(logits, -1).astype(jnp.int32), 4,
                          return_logits=True)
    return out, state


mesh = hsh.stream_mesh()
sharded, state = run(hsh.sharded_family(family, mesh), hsh.replicate(weights, mesh), prompts, lengths)
alone = [run(family, weights, prompts[i:i + 1], lengths[i:i + 1])[0] for i in range(2)]
bits = lambda x: np.asarray(x).view(np.uint32)
print(json.dumps(dict(
    devices=len(jax.devices()),
    metadata_devices=len(state.page_max[0].sharding.device_set),
    tokens=all(np.array_equal(np.asarray(sharded.tokens)[:, i], np.asarray(a.tokens)[:, 0])
               for i, a in enumerate(alone)),
    logits=all(np.array_equal(bits(sharded.logits)[:, i], bits(a.logits)[:, 0]) for i, a in enumerate(alone)),
    misses=int(np.asarray(sharded.misses).sum()),
)))
