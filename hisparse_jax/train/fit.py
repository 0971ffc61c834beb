"""Training a model from scratch: a dense warm-up, then sparse training (hisparse_jax.train.forward).

The model is DSA or the research kit's MLA model with any protocol indexer (train/model.py):
`fit(config, plan, corpus)` trains float32 master weights with AdamW on random windows of the
training documents, in two phases on one learning-rate schedule: `dense_steps` with dense
attention (the indexer learns the attention by KL), then `sparse_steps` attending to the
indexer's top-k. It evaluates the held-out windows with both attentions at the end of each phase
and returns the weights in the model's dtype, with the history and a summary.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..kit.protocol import overrides
from . import optimizer
from .checkpoint import MAX_EVAL_BATCHES, MAX_EVAL_SEQ_LEN, MAX_EVAL_TOKENS, MAX_SEED
from .corpus import Corpus, WindowSampler
from .forward import check_trainable, forward_loss
from .model import MODELS, family_of, model_config  # noqa: F401 (model_config: fit's public API since before)


_INT32 = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase of training.

    Attributes:
      name: a label for the logs.
      attention: "dense" (the whole causal prefix; the indexer learns it by KL) or "sparse" (the
        indexer's top-k plus the query itself; the KL over the selected keys).
      steps: optimizer steps (at most; see seconds); seq_len, batch: tokens per window, windows
        per step (a sparse phase needs seq_len >= top_k).
      lr: peak learning rate of the phase's warm-up + cosine schedule; warmup: its steps.
      seconds: a time budget, or None: the phase times its first steps after compiling and runs
        min(steps, what fits in `seconds`), its schedule set on that count.
    """

    name: str
    attention: str
    steps: int
    seq_len: int
    batch: int
    lr: float = 2e-3
    warmup: int = 20
    seconds: float | None = None

    def __post_init__(self):
        if self.attention not in ("dense", "sparse"):
            raise ValueError(f"Phase.attention must be 'dense' or 'sparse', got {self.attention!r}")
        for name, low in (("steps", 1), ("seq_len", 1), ("batch", 1), ("warmup", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _INT32:
                raise ValueError(f"Phase {self.name}: {name} must be an int in [{low}, 2^31 - 1], got {value!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not 0 <= self.lr < math.inf:
            raise ValueError(f"Phase {self.name}: lr must be a finite number >= 0, got {self.lr!r}")
        if self.seconds is not None and (isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float))
                                         or not 0 < self.seconds < math.inf):
            raise ValueError(f"Phase {self.name}: seconds must be None or a finite number > 0, got {self.seconds!r}")


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """Attributes:
      phases: trained in order, each on its own schedule (continued training, as a context
        extension continues pre-training).
      chunk: queries per attention block (divides every phase's seq_len).
      eval_seq_len, eval_batches: held-out windows evaluated (dense and sparse attention) after
        every phase.
      log_every: steps between two history entries.
    """

    phases: tuple[Phase, ...]
    chunk: int = 256
    eval_seq_len: int = 16384
    eval_batches: int = 4
    log_every: int = 10
    seed: int = 0

    def __post_init__(self):
        if not self.phases:
            raise ValueError("TrainPlan.phases: give at least one phase")
        # The bounds a checkpoint's meta.plan is held to (checkpoint.check_meta): a plan fit runs saves.
        for name, low, high in (("chunk", 1, MAX_EVAL_SEQ_LEN), ("eval_seq_len", 1, MAX_EVAL_SEQ_LEN),
                                ("eval_batches", 1, MAX_EVAL_BATCHES), ("log_every", 1, _INT32), ("seed", 0, MAX_SEED)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"TrainPlan.{name} must be an int in [{low}, {high}], got {value!r}")
        if self.eval_seq_len * self.eval_batches > MAX_EVAL_TOKENS:
            raise ValueError(f"TrainPlan: eval_batches x eval_seq_len = {self.eval_batches * self.eval_seq_len} "
                             f"held-out tokens, more than {MAX_EVAL_TOKENS}")
        for phase in self.phases:
            if phase.seq_len % self.chunk:
                raise ValueError(f"TrainPlan.chunk={self.chunk} must divide phase {phase.name}'s seq_len={phase.seq_len}")
        if self.eval_seq_len % self.chunk:
            raise ValueError(f"TrainPlan.chunk={self.chunk} must divide eval_seq_len={self.eval_seq_len}")


PLANS = {
    # Pre-training at 2K tokens (attention is cheap there), then the DSA recipe at 16K: a dense
    # warm-up, then sparse top-2048 training. Time budgets fit one H200 in about 8 minutes.
    "trace-model": TrainPlan(phases=(
        Phase("pretrain", "dense", steps=4000, seq_len=2048, batch=32, lr=3e-3, warmup=30, seconds=200),
        Phase("dense warm-up", "dense", steps=1000, seq_len=16384, batch=2, lr=1e-3, warmup=10, seconds=80),
        Phase("sparse", "sparse", steps=1000, seq_len=16384, batch=2, lr=1e-3, warmup=10, seconds=130),
    ), chunk=256, eval_seq_len=16384, eval_batches=4),
    "tiny": TrainPlan(phases=(
        Phase("pretrain", "dense", steps=20, seq_len=32, batch=8, lr=3e-3, warmup=5),
        Phase("dense warm-up", "dense", steps=10, seq_len=64, batch=4, lr=2e-3, warmup=2),
        Phase("sparse", "sparse", steps=10, seq_len=64, batch=4, lr=2e-3, warmup=2),
    ), chunk=32, eval_seq_len=64, eval_batches=2, log_every=5),
}


def _cast(config, params):
    return jax.tree.map(lambda p: p.astype(config.dtype), params)


@functools.partial(jax.jit, static_argnames=("config", "opt", "sparse", "chunk"), donate_argnames=("params", "state"))
def _train_step(config, opt, sparse, chunk, params, state, tokens, lr):
    def loss_fn(p):
        return forward_loss(config, _cast(config, p), tokens, sparse=sparse, chunk=chunk)

    (loss, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    params, state, norm = optimizer.update(opt, grads, state, params, lr)
    return params, state, dict(loss=loss, lm=parts["lm"], kl=parts["kl"], grad_norm=norm)


@functools.partial(jax.jit, static_argnames=("config", "sparse", "chunk"))
def _eval_step(config, sparse, chunk, params, tokens):
    _, parts = forward_loss(config, _cast(config, params), tokens, sparse=sparse, chunk=chunk)
    return parts


@functools.partial(jax.jit, static_argnames=("config", "chunk"))
def _measure_step(config, chunk, params, tokens):
    _, parts = forward_loss(config, _cast(config, params), tokens, sparse=False, chunk=chunk, measure=True)
    return parts


def evaluate(config, params, batches, chunk: int, measure: bool = False) -> dict:
    """Held-out next-token loss (nats per byte) and per-layer KL with dense and sparse attention;
    with measure, also dense.captured: per layer, the share of the dense attention mass (summed
    over heads) that the indexer's top-k keeps, over queries with more than top_k sealed keys."""
    out = {}
    for mode, sparse in (("dense", False), ("sparse", True)):
        step = (lambda b: _measure_step(config, chunk, params, b)) if measure and not sparse else \
            (lambda b: _eval_step(config, sparse, chunk, params, b))
        parts = [jax.device_get(step(jnp.asarray(b))) for b in batches]
        out[mode] = dict(lm=float(np.mean([p["lm"] for p in parts])),
                         kl=np.mean([p["kl"] for p in parts], axis=0).round(5).tolist())
        if "captured" in parts[0]:
            out[mode]["captured"] = [_mean_known(column) for column in zip(*[p["captured"] for p in parts])]
    out["sparse_minus_dense_lm"] = out["sparse"]["lm"] - out["dense"]["lm"]
    return out


def _mean_known(values) -> float | None:
    """The mean of the values that are not NaN (a window without a query past top_k has none), or None."""
    known = [float(v) for v in values if not np.isnan(v)]
    return round(float(np.mean(known)), 5) if known else None


_TIMED_STEPS = 3  # steps timed after the first (compiling) one to fit a phase in its seconds


def fit(config, plan: TrainPlan, corpus: Corpus, log: Callable[[str], None] = print):
    """Trains from seeded random weights (config: a dsa.Config or a kit Config, train/model.py).
    Returns (weights in config.dtype, history, summary)."""
    check_trainable(config)
    indexer = config.indexer
    if any(p.attention == "sparse" for p in plan.phases) and not overrides(indexer, "train_scores"):
        raise ValueError(f"{type(indexer).__name__}.train_scores: not defined, so a sparse phase has no scores to "
                         "select keys by; define train_scores ([b, chunk, T] float32 logits) or give a plan "
                         "without sparse phases")
    for phase in plan.phases:
        if phase.attention == "sparse" and phase.seq_len < config.top_k:
            raise ValueError(f"phase {phase.name}: seq_len={phase.seq_len} is below the model's top_k="
                             f"{config.top_k}; sparse training selects top_k keys: use seq_len >= top_k")
    longest = max([p.seq_len for p in plan.phases] + [plan.eval_seq_len])
    config = dataclasses.replace(config, max_context=max(config.max_context, longest))
    family = family_of(config)
    params = family.init_weights(dataclasses.replace(config, dtype="float32"), plan.seed)  # float32 master weights
    opt = optimizer.AdamW()
    state = optimizer.init(params)
    train_tokens = Corpus.packed(corpus.train)
    held = WindowSampler(Corpus.packed(corpus.held_out), plan.eval_batches, plan.eval_seq_len + 1, plan.seed + 1)
    eval_batches = list(next(held))  # [batch 1, T + 1] each: one window per call
    eval_batches = [b[None] for b in eval_batches]
    log(f"train: phases {', '.join(f'{p.name} ({p.attention}, {p.batch} x {p.seq_len})' for p in plan.phases)}; "
        f"top_k {config.top_k}; {corpus.tokens('train')} training tokens, {corpus.tokens('held_out')} held out")
    history, phases, step = [], [], 0
    start = time.perf_counter()
    for index, phase in enumerate(plan.phases):
        sampler = WindowSampler(train_tokens, phase.batch, phase.seq_len + 1, plan.seed + 100 * (index + 1))
        sparse, steps, t0, done = phase.attention == "sparse", phase.steps, time.perf_counter(), 0
        phase_start = time.perf_counter()
        i = 0
        while i < steps:
            lr = optimizer.learning_rate(phase.lr, i, steps, phase.warmup)
            params, state, m = _train_step(config, opt, sparse, plan.chunk, params, state,
                                           jnp.asarray(next(sampler)), jnp.float32(lr))
            i, done, step = i + 1, done + 1, step + 1
            if phase.seconds is not None and i in (1, 1 + _TIMED_STEPS):
                jax.block_until_ready(m)
                if i == 1:
                    timer = time.perf_counter()
                else:  # the phase's step count from its measured step time (the first step compiled)
                    per_step = (time.perf_counter() - timer) / _TIMED_STEPS
                    left = phase.seconds - (time.perf_counter() - phase_start)
                    steps = max(i, min(phase.steps, i + int(left / per_step)))
                    log(f"{phase.name}: {per_step * 1e3:.0f} ms per step; {steps} steps fit in {phase.seconds:.0f} s")
            if i % plan.log_every == 0 or i == steps:
                m = jax.device_get(m)
                seconds = time.perf_counter() - t0
                entry = dict(step=step, phase=phase.name, loss=float(m["loss"]), lm=float(m["lm"]),
                             kl=float(np.mean(m["kl"])), grad_norm=float(m["grad_norm"]), lr=lr,
                             tokens_per_s=done * phase.batch * phase.seq_len / seconds,
                             elapsed_s=time.perf_counter() - start)
                history.append(entry)
                log(f"{phase.name} step {i}/{steps}: loss {entry['lm']:.4f} nats/byte, indexer KL {entry['kl']:.4f}, "
                    f"grad norm {entry['grad_norm']:.3f}, {entry['tokens_per_s']:.0f} tokens/s")
                t0, done = time.perf_counter(), 0
        seconds = time.perf_counter() - phase_start
        e = evaluate(config, params, eval_batches, plan.chunk)
        phases.append(dict(dataclasses.asdict(phase), steps_run=steps, seconds=seconds,
                           tokens=steps * phase.batch * phase.seq_len, evaluation=e))
        log(f"after {phase.name} ({steps} steps, {seconds:.0f} s), held out at {plan.eval_seq_len}: dense attention "
            f"{e['dense']['lm']:.4f} nats/byte, sparse (top-{config.top_k}) {e['sparse']['lm']:.4f}, "
            f"indexer KL {np.mean(e['dense']['kl']):.4f} (dense) {np.mean(e['sparse']['kl']):.4f} (sparse)")
    summary = dict(train_seconds=time.perf_counter() - start, tokens_seen=sum(p["tokens"] for p in phases),
                   phases=phases, eval_seq_len=plan.eval_seq_len, eval_windows=plan.eval_batches)
    return _cast(config, params), history, summary
