"""Two indexers written the way a researcher writes one: outside the package, on the protocol
alone (hisparse_jax.kit), each a few lines. The kit tests run them through the same checks as
the shipped indexers."""

import dataclasses

import jax
import jax.numpy as jnp

from hisparse_jax import kit, layout


@dataclasses.dataclass(frozen=True)
class Recent(kit.Indexer):
    """StreamingLLM-like: the `sink` first records and the most recent others; no parameters, no
    metadata, its own `select`."""

    sink: int = 2

    def select(self, config, params, metadata, h, positions, sealed):
        k, s = config.top_k, sealed[:, None]
        sinks = jnp.broadcast_to(jnp.arange(self.sink), (s.shape[0], self.sink))
        recent = jnp.maximum(s - (k - self.sink), self.sink) + jnp.arange(k - self.sink)
        ids = jnp.concatenate([sinks, recent], axis=1)  # ascending; the ids < sealed are a prefix
        return jnp.where(ids < s, ids, -1).astype(jnp.int32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Norms:
    norm: jax.Array = layout.field(layout.INDEXER_METADATA, batch_axis=0)  # [b, max_context] f32


@dataclasses.dataclass(frozen=True)
class KeyNorm(kit.Indexer):
    """Query-free: a record scores the largest learned-key norm among its tokens."""

    dim: int = 8

    def init_params(self, config, seed):
        return {"w": jax.random.normal(jax.random.key(seed), (config.d_model, self.dim), config.dtype)}

    def init_metadata(self, config, batch):
        return Norms(jnp.zeros((batch, config.max_context), jnp.float32))

    def write(self, config, params, metadata, h, positions, written):
        norm = jnp.linalg.norm((h @ params["w"]).astype(jnp.float32), axis=-1)
        at = jnp.where(written, positions, config.max_context)
        return Norms(metadata.norm.at[jnp.arange(h.shape[0])[:, None], at].set(norm, mode="drop"))

    def score(self, config, params, metadata, h, positions, sealed):
        return metadata.norm.reshape(h.shape[0], config.num_records, config.page_size).max(axis=-1)


# The two-level indexer at the tiny model's size (k = 16): pages of 16 tokens, 8 candidates, 12
# hot pages, so a trace recorded after a few hundred tokens fetches and evicts fine-key pages.
TWO_LEVEL_TINY = kit.TwoLevel(page=16, candidates=8, coarse_dim=8, fine_dim=16, heads=2, hot_pages=12)
