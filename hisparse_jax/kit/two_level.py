"""A two-level indexer: coarse keys per page on the device pick candidate pages; the fine
per-token keys of those pages, kept in a host pool like the KV, pick the records attended.

DSA's lightning indexer reads every token's key every step, so its keys must stay on the device
(at 128K tokens, 132 MiB of fp8 keys per request on the glm5-h200 slice, most of HiSparse's
device state). Here a step reads per-token keys for `candidates` pages only:

- coarse level (device metadata): per index page of `page` tokens the running sum of a learned
  per-token key c_s = W_ck h_s [coarse_dim] (float32: sum of keys rounded to the model dtype),
  restarting when the page opens; a closed page's key is the mean K_p = sum / page. Queries
  score page p by S_p = sum_j w_j relu(q_j . K_p) / sqrt(heads coarse_dim) (DSA's form), and
  the library's top-k picks the `candidates` best closed pages (ties to the lower page);
- fine level (a record kind of the indexer's own, kit.RecordKind): per token the key
  f_s = W_fk h_s [fine_dim] in the model's dtype, or (fine_dtype="float8_e4m3fn") as DSA's
  lightning indexer stores its keys: e4m3 codes with a float32 scale per token (hisparse_jax.fp8,
  the package's one quantizer), fine_dim + 4 bytes a token; a page of them is one record.
  "hisparse": sealed pages in the pinned host pool, fetched into a hot buffer with its own LRU
  by RESOLVE (a second RESOLVE per selecting layer, on the candidate page ids); "device": a
  device buffer read in place. Tokens score s_t = sum_j u_j relu(r_j . f_t) / sqrt(heads fine_dim);
- a record (page_size tokens) takes the best score of its tokens; the library's top-k over the
  candidates' records plus the open page's picks the k records attended, ascending.

The open index page (the query's own, not yet full) is always a candidate, outside the fetch
budget: its fine keys are the record kind's open record, on the device, read with no RESOLVE,
and the newest tokens are the likeliest to matter; its coarse key (running) is then never
needed to select it. There are no forced sink pages: the coarse level is distilled from the
attention, sinks included, so a page that draws attention ranks high by its own score, and a
forced page would spend a fetch slot on every query.

Training (kit.TrainLevels): the fine logits are distilled from the head-summed token attention,
the coarse logits from that attention summed over each closed page; sparse training attends to
what decode would pick (candidate pages by the coarse logits, then the top-k tokens by fine).
With fp8 fine keys training scores the keys decode reads, quantized and dequantized (as DSA's
train_features does with fp8 keys); the gradient passes the rounding straight through.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from .. import fp8, layout
from ..models import layers
from ..models.weights import init_normal
from ..rounding import as_stored
from ..topk import select_topk
from .protocol import Indexer, RecordKind, TrainLevels

f32 = jnp.float32
FP8 = "float8_e4m3fn"
FINE_DTYPES = (None, "bfloat16", FP8)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CoarseKeys:
    """Per index page, the running float32 sum of its tokens' coarse keys ([b, pages, coarse_dim])."""

    coarse_sum: jax.Array = layout.field(layout.INDEXER_METADATA, batch_axis=0)


@dataclasses.dataclass(frozen=True)
class TwoLevel(Indexer):
    """Attributes:
      page: tokens per index page (a multiple of the model's page_size): one coarse key and one
        fine record per page.
      candidates: closed pages whose fine keys a step fetches (plus the open page, always).
      coarse_dim, fine_dim: the coarse and fine keys' widths.
      heads: query heads of each level, summed with learned weights.
      hot_pages: hot buffer slots of fine-key pages per stream and group ("hisparse"), >= candidates.
      fine_dtype: how the fine keys are stored: None (the model's dtype: bfloat16 on the trace
        model and the deployment slices), "bfloat16", or "float8_e4m3fn" (e4m3 codes and a
        float32 scale per token, DSA's fp8 keys: fine_dim + 4 bytes a token, stored as uint8).
    """

    page: int = 64
    candidates: int = 32
    coarse_dim: int = 64
    fine_dim: int = 64
    heads: int = 4
    hot_pages: int = 64
    fine_dtype: str | None = None

    @property
    def name(self) -> str:
        return f"two-level-{self.page}x{self.candidates}" + ("-fp8" if self.fine_dtype == FP8 else "")

    def check(self, config) -> None:
        for knob in ("page", "candidates", "coarse_dim", "fine_dim", "heads", "hot_pages"):
            value = getattr(self, knob)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TwoLevel.{knob}: must be a positive int, got {value!r}")
        if self.page % config.page_size:
            raise ValueError(f"TwoLevel.page: page={self.page} must be a multiple of the model's page_size="
                             f"{config.page_size} (a fine record covers whole KV records)")
        if self.fine_dtype not in FINE_DTYPES:
            raise ValueError(f"TwoLevel.fine_dtype: must be one of {', '.join(map(repr, FINE_DTYPES))}, got "
                             f"{self.fine_dtype!r}")
        if self.hot_pages < self.candidates:
            raise ValueError(f"TwoLevel.hot_pages: hot_pages={self.hot_pages} < candidates={self.candidates}; every "
                             "fetched page needs a hot slot: raise hot_pages")

    def init_params(self, config, seed: int) -> dict:
        D, H = config.d_model, self.heads
        return init_normal(seed, {"c_k": ((D, self.coarse_dim), D), "c_q": ((D, H, self.coarse_dim), D),
                                  "c_w": ((D, H), D), "f_k": ((D, self.fine_dim), D),
                                  "f_q": ((D, H, self.fine_dim), D), "f_w": ((D, H), D)}, config.dtype)

    # ------------------------------------------------------------------ keys and queries

    def _key(self, config, params, h, level: str):
        """Per-token keys [..., dim] rounded to the model dtype (as stored), float32."""
        key = layers.weight_einsum("...d,de->...e", h, params[f"{level}_k"]).astype(config.dtype)
        return key.astype(f32)

    def _query(self, params, h, level: str, dim: int):
        """(q [..., heads, dim], head weights [..., heads] / sqrt(heads dim)), float32."""
        q = layers.weight_einsum("...d,dje->...je", h, params[f"{level}_q"], preferred_element_type=f32)
        w = layers.weight_einsum("...d,dj->...j", h, params[f"{level}_w"], preferred_element_type=f32)
        return q, w / math.sqrt(self.heads * dim)

    @staticmethod
    def _scores(q, w, keys, spec: str):
        """sum_j w_j relu(q_j . k): q [..., heads, dim] against keys by einsum `spec`."""
        return jnp.einsum(spec[1], jax.nn.relu(jnp.einsum(spec[0], q, keys)), w)

    # ------------------------------------------------------------------ device metadata

    def init_metadata(self, config, batch: int) -> CoarseKeys:
        return CoarseKeys(jnp.zeros((batch, -(-config.max_context // self.page), self.coarse_dim), f32))

    def write(self, config, params, metadata, h, positions, written):
        key = jnp.where(written[..., None], self._key(config, params, h, "c"), 0.0)  # [b, T, cd]
        sums = metadata.coarse_sum
        pages = sums.shape[1]
        if h.shape[1] == 1:  # decode: one token; its page restarts when the token opens it
            rows = jnp.arange(h.shape[0])[:, None]
            at = jnp.where(written, positions // self.page, pages)  # unwritten: dropped
            opens = jnp.where(written & (positions % self.page == 0), at, pages)
            return CoarseKeys(sums.at[rows, opens].set(0.0, mode="drop").at[rows, at].add(key, mode="drop"))
        # The prompt (positions 0 .. T-1, the kit's prefill): page sums by a reduction over each
        # page's tokens, not a scatter-add (whose order of adds a GPU does not fix).
        T = h.shape[1]
        n = -(-T // self.page)
        padded = jnp.pad(key, ((0, 0), (0, n * self.page - T), (0, 0)))
        page_sums = padded.reshape(h.shape[0], n, self.page, -1).sum(axis=2)
        return CoarseKeys(jax.lax.dynamic_update_slice_in_dim(sums, page_sums[:, :pages], 0, axis=1))

    def page_scores(self, params, h, coarse_sum):
        """S [b, pages] float32 of queries h [b, D] against every page's mean coarse key."""
        q, w = self._query(params, h, "c", self.coarse_dim)
        # The mean's 1 / page on the query: scaling the sums would write a metadata-sized copy.
        return self._scores(q / self.page, w, coarse_sum, ("bjd,bpd->bjp", "bjp,bj->bp"))

    # ------------------------------------------------------------------ the fine record kind

    def record_kind(self, config) -> RecordKind:
        if self.fine_dtype == FP8:
            return RecordKind(page=self.page, width=self.fine_dim + fp8.SCALE_BYTES, fetch=self.candidates,
                              hot_slots=self.hot_pages, dtype="uint8")
        return RecordKind(page=self.page, width=self.fine_dim, fetch=self.candidates, hot_slots=self.hot_pages,
                          dtype=self.fine_dtype)

    def record_values(self, config, params, h, positions):
        key = self._key(config, params, h, "f")
        if self.fine_dtype == FP8:
            return fp8.pack_rows(*fp8.quantize_rows(key))  # one scale per token
        return key.astype(self.fine_dtype or config.dtype)

    def fine_values(self, records):
        """Stored fine keys [..., width] (records, the open page) -> the float32 keys they stand for."""
        if self.fine_dtype == FP8:
            return fp8.dequantize_rows(*fp8.unpack_rows(records))
        return records.astype(f32)

    def _train_fine_keys(self, config, params, h):
        """Every token's fine key [b, T, fine_dim] float32 as decode reads it back from its record."""
        key = self._key(config, params, h, "f")
        if self.fine_dtype == FP8:
            return fp8.round_trip(key)
        return as_stored(key, self.fine_dtype or config.dtype)

    def fetch(self, config, params, metadata, h, positions, sealed):
        """The `candidates` best closed pages by coarse score (sealed: closed pages), ascending,
        -1 padding: the library's top-k, ties to the lower page."""
        scores = self.page_scores(params, h, metadata.coarse_sum)
        top = min(self.candidates, scores.shape[1])
        ids = select_topk(scores, sealed, top, implementation=config.implementation)
        return jnp.pad(ids, ((0, 0), (0, self.candidates - top)), constant_values=-1)

    def select(self, config, params, metadata, h, positions, sealed, fetched=None):
        """The top-k records among the fetched pages' and the open page's (ids < sealed), by the
        best fine score of their tokens; ascending, -1 padding."""
        P, b = config.page_size, h.shape[0]
        per = self.page // P  # records per index page
        q, w = self._query(params, h, "f", self.fine_dim)
        closed = self._scores(q, w, self.fine_values(fetched.records),
                              ("bjd,bctd->bjct", "bjct,bj->bct"))  # [b, c, page]
        own = self._scores(q, w, self.fine_values(fetched.open_page), ("bjd,btd->bjt", "bjt,bj->bt"))  # [b, page]
        rec = lambda s: jnp.max(s.reshape(*s.shape[:-1], per, P), axis=-1)  # a record: its best token
        scores = jnp.concatenate([rec(closed).reshape(b, -1), rec(own)], axis=1)  # [b, (c + 1) per]
        lane = jnp.arange(per, dtype=jnp.int32)
        ids = jnp.concatenate([(fetched.ids[..., None] * per + lane).reshape(b, -1),
                               (positions // self.page)[:, None] * per + lane], axis=1)
        ok = jnp.concatenate([jnp.repeat(fetched.valid, per, axis=1), jnp.ones((b, per), bool)], axis=1)
        ok &= (ids >= 0) & (ids < sealed[:, None])
        # Entries are in ascending id order where ok (fetched ids ascending, the open page last),
        # so the top-k's tie to the lower entry is the tie to the lower id. Entries not ok score
        # -inf, and are dropped below if the top-k had to take them (fewer than k ok entries).
        scores = jnp.where(ok, scores, -jnp.inf)
        k = config.top_k
        if scores.shape[1] < k:
            pad = k - scores.shape[1]
            scores = jnp.pad(scores, ((0, 0), (0, pad)), constant_values=-jnp.inf)
            ids, ok = jnp.pad(ids, ((0, 0), (0, pad)), constant_values=-1), jnp.pad(ok, ((0, 0), (0, pad)))
        full = jnp.full((b,), scores.shape[1], jnp.int32)
        pick = select_topk(scores, full, k, implementation=config.implementation)  # entries, ascending
        at = jnp.clip(pick, 0)
        keep = (pick >= 0) & jnp.take_along_axis(ok, at, axis=1)
        big = jnp.iinfo(jnp.int32).max
        chosen = jnp.sort(jnp.where(keep, jnp.take_along_axis(ids, at, axis=1), big), axis=1)
        return jnp.where(chosen == big, -1, chosen).astype(jnp.int32)

    # ------------------------------------------------------------------ training

    def train_features(self, config, params, h, positions):
        """Once per sequence: every closed page's mean coarse key, every token's fine key, and the
        queries of both levels."""
        b, T, _ = h.shape
        n = -(-T // self.page)
        ck = jnp.pad(self._key(config, params, h, "c"), ((0, 0), (0, n * self.page - T), (0, 0)))
        page_keys = ck.reshape(b, n, self.page, -1).sum(axis=2) / self.page  # [b, n, cd]
        cq, cw = self._query(params, h, "c", self.coarse_dim)
        fq, fw = self._query(params, h, "f", self.fine_dim)
        return dict(page_keys=page_keys, cq=cq, cw=cw, fine_keys=self._train_fine_keys(config, params, h),
                    fq=fq, fw=fw)

    def train_scores(self, config, params, features, positions, start, chunk: int) -> TrainLevels:
        f = features
        take = lambda a: jax.lax.dynamic_slice_in_dim(a, start, chunk, axis=1)
        fine = self._scores(take(f["fq"]), take(f["fw"]), f["fine_keys"], ("bcjd,btd->bcjt", "bcjt,bcj->bct"))
        coarse = self._scores(take(f["cq"]), take(f["cw"]), f["page_keys"], ("bcjd,bpd->bcjp", "bcjp,bcj->bcp"))
        return TrainLevels(fine=fine, coarse=coarse, page=self.page, candidates=self.candidates)


# Named settings for sweeps (`--indexer hisparse_jax.kit.two_level:PAGE64_C64`): candidate tokens
# (candidates x page) at 2-8x the trace model's k = 2048, hot buffers of 2 x candidates pages.
PAGE64_C64 = TwoLevel(page=64, candidates=64, hot_pages=128)
PAGE64_C128 = TwoLevel(page=64, candidates=128, hot_pages=256)
PAGE32_C128 = TwoLevel(page=32, candidates=128, hot_pages=256)
PAGE128_C32 = TwoLevel(page=128, candidates=32, hot_pages=64)
# PAGE64_C64 with fp8 fine keys: 68 B a token instead of bfloat16's 128 (fine_dim 64), so a fetched
# page of fine keys is 4.25 KiB instead of 8 KiB.
PAGE64_C64_FP8 = TwoLevel(page=64, candidates=64, hot_pages=128, fine_dtype=FP8)
