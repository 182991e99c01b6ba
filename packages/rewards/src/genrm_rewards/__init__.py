"""Reward functions that call GenRM judges (dapo-genrm, dual, agentic, pairwise), where a judge
failure is reported as ``status="judge_error"`` with ``score=None`` — never as a reward of 0.

Contract: ``async def fn(args, sample) -> dict`` (``{"score", "status", "acc", "pred", ...}``)
and its batch variant ``async def fn(args, samples) -> list[dict]``; see ``genrm_rewards.types``.
"""

from importlib.metadata import version as _version

from genrm_rewards.args import RewardArgs, resolve_args
from genrm_rewards.errors import RewardConfigError, RewardError, RewardInputError
from genrm_rewards.registry import (
    as_batch,
    available,
    get_batch_reward_fn,
    get_reward_fn,
    is_group_level,
    load_custom,
    register,
    resolve_reward_fn,
)
from genrm_rewards.types import (
    SCORED_STATUSES,
    BatchRewardFn,
    JudgeClient,
    RewardFn,
    RewardResult,
    RewardStatus,
    SampleLike,
)

__version__ = _version("genrm-rewards")

__all__ = [
    "SCORED_STATUSES",
    "BatchRewardFn",
    "JudgeClient",
    "RewardArgs",
    "RewardConfigError",
    "RewardError",
    "RewardFn",
    "RewardInputError",
    "RewardResult",
    "RewardStatus",
    "SampleLike",
    "__version__",
    "as_batch",
    "available",
    "get_batch_reward_fn",
    "get_reward_fn",
    "is_group_level",
    "load_custom",
    "register",
    "resolve_args",
    "resolve_reward_fn",
]
