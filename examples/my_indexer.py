"""A new sparse indexer in a file of its own: one learned low-rank key per token, scored by a dot
product with a learned query (docs/research.md takes it through training, recording, the policy
lab, the byte account and the bitwise tests; nothing inside hisparse_jax changes)."""

import dataclasses

import jax
import jax.numpy as jnp

from hisparse_jax import layout
from hisparse_jax.kit import Indexer


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Keys:
    """What the indexer keeps on the device: `dim` values per token (its whole byte cost)."""

    keys: jax.Array = layout.field(layout.INDEXER_METADATA, batch_axis=0)  # [b, max_context, dim]


@dataclasses.dataclass(frozen=True)
class DotIndexer(Indexer):
    dim: int = 8  # the key width kept per token

    def init_params(self, config, seed):
        q, k = jax.random.split(jax.random.key(seed))
        scale = config.d_model ** -0.5
        return dict(w_q=scale * jax.random.normal(q, (config.d_model, self.dim), config.dtype),
                    w_k=scale * jax.random.normal(k, (config.d_model, self.dim), config.dtype))

    def init_metadata(self, config, batch):
        return Keys(jnp.zeros((batch, config.max_context, self.dim), config.dtype))

    def write(self, config, params, metadata, h, positions, written):
        rows = jnp.arange(h.shape[0])[:, None]
        new = (h @ params["w_k"]).astype(metadata.keys.dtype)  # [b, T, dim]
        old = metadata.keys[rows, positions]
        return Keys(metadata.keys.at[rows, positions].set(jnp.where(written[..., None], new, old)))

    def score(self, config, params, metadata, h, positions, sealed):
        tokens = jnp.einsum("bd,btd->bt", h @ params["w_q"], metadata.keys, preferred_element_type=jnp.float32)
        return tokens.reshape(h.shape[0], config.num_records, config.page_size).max(axis=-1)  # a page: its best token

    def train_features(self, config, params, h, positions):  # once per sequence: every token's query and key
        return h @ params["w_q"], h @ params["w_k"]

    def train_scores(self, config, params, features, positions, start, chunk):
        queries, keys = features
        queries = jax.lax.dynamic_slice_in_dim(queries, start, chunk, axis=1)
        return jnp.einsum("bcd,btd->bct", queries, keys, preferred_element_type=jnp.float32)


INDEXER = DotIndexer()
