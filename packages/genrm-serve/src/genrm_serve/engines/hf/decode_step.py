"""One decode step of a fixed batch, replayed from a CUDA graph.

Decoding a batch of rows is one forward of one token per row per step. On a GPU that step is
bound by the host, not the device: a 0.6B model at 64 rows does ~1 ms of kernels and ~40 ms of
Python (transformers' modules, the compiled layers' guards, the eager attention between them). A
CUDA graph records the step's kernels once and replays them with one launch, so the host only
copies the step's tokens in and samples from the logits that come out.

A graph replays fixed addresses: the tokens, the positions (the decode state's ``write_at``,
advanced in place), the static K/V cache and the logits are the same tensors on every replay.
A row that finishes therefore stays in the batch as a dead slot (its tokens are ignored) until
half the batch is dead; then the batch is compacted and the step captured again for the new
size, so a batch of ``n`` rows captures at most ``log2(n) + 1`` graphs. Each graph has its own
memory pool, freed with it (a pool shared across a compaction is released when the graph that
held it dies, and torch 2.11's allocator then asserts on the next capture into it).

Without a graph (off CUDA, a batch too short to repay a capture, a capture that failed) the same
object runs the step eagerly against the same buffers: one decode step, one code path; the CPU
tests exercise its dead slots, compaction and in-place positions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from genrm_serve.engines.hf.packing import DecodeState, activate

__all__ = ["DecodeStep"]

logger = logging.getLogger(__name__)


class DecodeStep:
    """The forward of one token per row of ``state``, as a callable ``tokens -> logits``."""

    def __init__(self, forward: Callable[..., Any], state: DecodeState, *, graph: bool) -> None:
        self.state = state
        self.forward = forward
        rows = int(state.write_at.shape[0])
        self.tokens = torch.zeros((rows, 1), dtype=torch.long, device=state.write_at.device)
        self.use_graph = graph
        self.graph: Any = None
        self.logits: torch.Tensor | None = None

    def _run(self) -> torch.Tensor:
        self.state.clear_masks()  # computed inside the step (and so inside a graph)
        with activate(self.state):
            out = self.forward(
                input_ids=self.tokens,
                position_ids=self.state.write_at[:, None],
                use_cache=False,
                logits_to_keep=1,
            )
        logits: torch.Tensor = out.logits[:, -1, :].float()
        return logits

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[rows, vocab]`` (float32) after ``tokens`` ``[rows]``; on a graph, the same
        tensor every step: read it before the next call."""
        self.tokens.copy_(tokens[:, None])
        if not self.use_graph:
            return self._run()
        if self.graph is None:
            self._capture()
        if not self.use_graph:  # the capture failed: this step runs eagerly from now on
            return self._run()
        self.graph.replay()
        assert self.logits is not None
        return self.logits

    def _capture(self) -> None:
        device = self.tokens.device
        # Warm up on a side stream (compiles a new batch size, picks matmul kernels, creates
        # the allocations a capture may not), as CUDA graphs require. The warm-up writes this
        # step's K/V at this step's positions: the replay writes the same values again.
        side = _side_stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self._run()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=side):
                self.logits = self._run()
        except Exception as err:  # a step that cannot be captured still decodes, eagerly
            logger.warning("decode step not captured as a CUDA graph (%s); eager", err)
            self.use_graph = False
            self.logits = None
            return
        self.graph = graph


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """One warm-up and capture stream per device for the process: cuBLAS keeps a workspace for
    every stream it has run on, so a new stream per capture would leave one behind each time."""
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    return _SIDE_STREAMS[device]
