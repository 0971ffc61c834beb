"""A Quest-style page indexer on the kit's protocol: per page of tokens, the elementwise max and
min of a learned key; a query scores a page by Quest's upper bound on its dot products.

J. Tang et al., "Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference", ICML
2024, bound a page's attention scores by sum_i max(q_i M_i, q_i m_i), M and m the elementwise
max and min of its keys. MLA has no per-head keys to bound (a record is a shared latent), so
this indexer learns its own, as DSA's lightning indexer does:

- key k[s] = W_k h_s [dim] per token; per index page of `page` tokens the bounds
  M_p = max_s k[s], m_p = min_s k[s], running while the page is open (the bounds of the tokens
  written so far), kept on the device: 2 x dim x itemsize bytes per `page` tokens per group;
- query heads q_j = W_q h [heads, dim] and head weights w_j = W_w h [heads] score page p by
  S_p = sum_j w_j sum_i max(q_ji M_pi, q_ji m_pi) / sqrt(heads dim)
  (computed as relu(q) . M + min(q, 0) . m, the same terms: M >= m);
- a record takes the best score of its tokens, a token its page's score: the kit's top-k then
  picks whole index pages, ties to the lower id.

`train_scores` gives each past token its page's bound, the query's own page by its running
bounds (what decode sees): the kit's training distills the attention into W_k, W_q and W_w.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from .. import layout
from ..models import layers, products
from ..models.weights import init_normal
from ..rounding import as_stored
from .protocol import Indexer


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PageBounds:
    """Per index page, the elementwise max and min of its tokens' keys ([b, pages, dim] each)."""

    page_max: jax.Array = layout.field(layout.INDEXER_METADATA, batch_axis=0)
    page_min: jax.Array = layout.field(layout.INDEXER_METADATA, batch_axis=0)


@dataclasses.dataclass(frozen=True)
class PageMinMax(Indexer):
    """Attributes:
      page: tokens per index page (any; it need not match page_size nor divide max_context: the
        last page is then partial).
      dim: the learned key's width.
      heads: query heads, summed with learned weights.
    """

    page: int = 64
    dim: int = 64
    heads: int = 4

    # h's projections: decoding runs them in the anchor layer's one input matmul (kit.inputs)
    input_weights: ClassVar[tuple[str, ...]] = ("w_k", "w_q", "w_head")

    @property
    def name(self) -> str:
        return f"page-minmax-{self.page}"

    def check(self, config) -> None:
        for knob in ("page", "dim", "heads"):
            value = getattr(self, knob)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"PageMinMax.{knob}: must be a positive int, got {value!r}")

    def init_params(self, config, seed: int) -> dict:
        D = config.d_model
        return init_normal(seed, {"w_k": ((D, self.dim), D), "w_q": ((D, self.heads, self.dim), D),
                                  "w_head": ((D, self.heads), D)}, config.dtype)

    def init_metadata(self, config, batch: int) -> PageBounds:
        # ceil: the last page may be partial (hisparse-bench sizes max_context = context + steps + 1).
        shape = (batch, -(-config.max_context // self.page), self.dim)
        return PageBounds(jnp.zeros(shape, config.dtype), jnp.zeros(shape, config.dtype))

    def write(self, config, params, metadata, h, positions, written):
        key = products.project("...d,de->...e", h, params["w_k"]).astype(metadata.page_max.dtype)  # [b, T, dim]
        rows = jnp.arange(h.shape[0])[:, None]
        pages = metadata.page_max.shape[1]
        at = jnp.where(written, positions // self.page, pages)  # unwritten tokens: dropped
        # A page's first token opens it: its bounds restart from that token (a scatter reset to
        # -inf / +inf, then a scatter max / min of every written token, in one pass for any T).
        opens = jnp.where(written & (positions % self.page == 0), positions // self.page, pages)
        inf = jnp.asarray(jnp.inf, key.dtype)
        top = metadata.page_max.at[rows, opens].set(-inf, mode="drop").at[rows, at].max(key, mode="drop")
        bottom = metadata.page_min.at[rows, opens].set(inf, mode="drop").at[rows, at].min(key, mode="drop")
        return PageBounds(top, bottom)

    def _query(self, params, h):
        """h [..., D] -> (relu(q), min(q, 0)) [..., heads, dim] and head weights [..., heads], f32."""
        q = products.project("...d,dje->...je", h, params["w_q"], preferred_element_type=jnp.float32)
        w = products.project("...d,dj->...j", h, params["w_head"], preferred_element_type=jnp.float32)
        return jnp.maximum(q, 0.0), jnp.minimum(q, 0.0), w / math.sqrt(self.heads * self.dim)

    def page_scores(self, params, h, page_max, page_min):
        """S [b, pages] float32 of queries h [b, D] against bounds [b, pages, dim]."""
        up, down, w = self._query(params, h)
        f32 = jnp.float32
        bound = (jnp.einsum("bjd,bpd->bjp", up, page_max.astype(f32))
                 + jnp.einsum("bjd,bpd->bjp", down, page_min.astype(f32)))
        return jnp.einsum("bjp,bj->bp", bound, w)

    def score(self, config, params, metadata, h, positions, sealed):
        pages = self.page_scores(params, h, metadata.page_max, metadata.page_min)  # [b, pages]
        tokens = jnp.repeat(pages, self.page, axis=1)[:, :config.max_context]  # a token scores as its page
        return jnp.max(tokens.reshape(h.shape[0], config.num_records, config.page_size), axis=-1)

    def train_features(self, config, params, h, positions):
        """Per token, once per sequence: the closed bounds of its page, the running bounds up to
        it (what decode sees of the query's own page) and its query terms."""
        b, T, _ = h.shape
        P, n = self.page, -(-h.shape[1] // self.page)
        # Keys rounded to the metadata dtype, as decode stores them.
        key = as_stored(layers.weight_einsum("...d,de->...e", h, params["w_k"]), config.dtype)
        pad = lambda fill: jnp.pad(key, ((0, 0), (0, n * P - T), (0, 0)), constant_values=fill).reshape(b, n, P, -1)
        running = lambda scan, fill: scan(pad(fill), axis=2).reshape(b, n * P, -1)[:, :T]
        up, down, w = self._query(params, h)  # [b, T, heads, dim], [b, T, heads]
        return dict(full_max=pad(-jnp.inf).max(axis=2), full_min=pad(jnp.inf).min(axis=2),  # [b, n, dim]
                    run_max=running(jax.lax.cummax, -jnp.inf), run_min=running(jax.lax.cummin, jnp.inf),  # [b, T, dim]
                    up=up, down=down, w=w)

    def train_scores(self, config, params, features, positions, start, chunk: int):
        f = features
        take = lambda a: jax.lax.dynamic_slice_in_dim(a, start, chunk, axis=1)
        up, down, w = take(f["up"]), take(f["down"]), take(f["w"])  # [b, C, heads, dim], [b, C, heads]
        closed = (jnp.einsum("bcjd,bpd->bcjp", up, f["full_max"]) + jnp.einsum("bcjd,bpd->bcjp", down, f["full_min"]))
        closed = jnp.einsum("bcjp,bcj->bcp", closed, w)  # [b, C, pages]
        own = (jnp.einsum("bcjd,bcd->bcj", up, take(f["run_max"]))
               + jnp.einsum("bcjd,bcd->bcj", down, take(f["run_min"])))
        own = jnp.einsum("bcj,bcj->bc", own, w)  # [b, C]: the query's own page, by its bounds so far
        key_page = positions // self.page  # [T]
        query_page = jax.lax.dynamic_slice_in_dim(positions, start, chunk) // self.page  # [C]
        logits = jnp.take(closed, key_page, axis=2)  # [b, C, T]
        return jnp.where(key_page[None, None, :] == query_page[None, :, None], own[..., None], logits)
