"""The selection lab: which records a sparse-attention decode selects, and what caching them costs.

- `synthetic`: calibrated synthetic selection traces (docs/traces.md), generated before a decode
  and fed to it in place of the model's own top-k.
- `recorded`: selection traces recorded from a real model's decode, and their compact file format.
- `policies`: eviction policies (RESOLVE's LRU, FIFO, random, CLOCK, LFU, Belady) replayed on a
  trace, counting the records a hot buffer of B slots fetches (docs/policies.md).
"""

from . import policies, recorded, synthetic
from .policies import POLICIES, replay, simulate
from .recorded import RecordedTrace, load_trace, save_trace
from .synthetic import CALIBRATIONS, TraceConfig, selections

__all__ = [
    "policies",
    "recorded",
    "synthetic",
    "CALIBRATIONS",
    "POLICIES",
    "RecordedTrace",
    "TraceConfig",
    "load_trace",
    "replay",
    "save_trace",
    "selections",
    "simulate",
]
