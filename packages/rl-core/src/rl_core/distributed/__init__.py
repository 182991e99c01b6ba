"""The trainer as Ray actors: one worker per GPU of a role, one ``torch.distributed`` group.

``TrainGroup`` is the driver's handle on the actor role's workers (data parallel: each rank takes
a token-balanced share of every optimizer step, gradients are all-reduced); ``ForwardGroup`` holds
the log-prob-only roles of fully-async (``reference``, ``actor_fwd``). ``LocalLearner`` is the same
interface over a backend in this process, for tests and single-process runs.
"""

from rl_core.distributed.group import ForwardGroup, Learner, LocalLearner, TrainGroup
from rl_core.distributed.sharding import split_by_tokens

__all__ = ["ForwardGroup", "Learner", "LocalLearner", "TrainGroup", "split_by_tokens"]
