"""The embedded engine (``engine: hf``): a transformers causal LM, in-process, on CPU or one GPU.

- :mod:`~genrm_serve.engines.hf.engine`: :class:`HFEngine`, the model's life (load, memory
  share, sleep / wake, weight updates) and running a chunk of rows on it;
- :mod:`~genrm_serve.engines.hf.batching`: which rows go into which chunk (the token budget);
- :mod:`~genrm_serve.engines.hf.packing`: the packed prefill over a radix tree of prompts, and
  the static-cache attention of decoding;
- :mod:`~genrm_serve.engines.hf.decode_step`: one decode step, replayed from a CUDA graph;
- :mod:`~genrm_serve.engines.hf.sampling`: batched, per-row-seeded sampling on the device;
- :mod:`~genrm_serve.engines.hf.snapshot`: where a CPU engine keeps updated weights asleep.

Importing this package imports torch: ``genrm_serve.engines.make_engine`` imports it only when
an hf engine is made.
"""

from __future__ import annotations

from genrm_serve.engines.hf.engine import (
    FALLBACK_CHAT_TEMPLATE,
    MAX_BATCH_TOKENS,
    HFEngine,
    VerdictUnavailableError,
    batch_token_budget,
    model_bytes,
    share_budget,
)

__all__ = [
    "FALLBACK_CHAT_TEMPLATE",
    "MAX_BATCH_TOKENS",
    "HFEngine",
    "VerdictUnavailableError",
    "batch_token_budget",
    "model_bytes",
    "share_budget",
]
