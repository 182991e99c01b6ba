"""The unit of work of one GRPO step: a prompt, one sampled response, and what became of it.

One mutable object travels rollout → reward → advantages → train, so every phase adds its part
(tokens and log-probs from the engine, score and status from the reward function, advantage from
GRPO) and a judge failure stays attached to the sample it happened to instead of being lost in a
parallel list. It satisfies genrm-rewards' ``SampleLike`` protocol (``prompt``, ``response``,
``label``, ``metadata``), so reward functions take it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

#: Reward statuses, as genrm-rewards reports them; ``pending`` means not scored yet, ``aborted``
#: that the engine did not finish the response (it is neither judged nor trained),
#: ``judge_timeout`` that it was not judged by its group's deadline (``--group-judge-deadline-s``).
RewardStatus = Literal[
    "pending", "ok", "unparsed", "judge_error", "deferred", "aborted", "judge_timeout"
]
FinishReason = Literal["stop", "length", "abort", "error"]
#: Why a sample is out of the loss and of its group's statistics (see :attr:`Sample.left_out`).
LeftOut = Literal[
    "judge_error", "judge_timeout", "aborted", "empty", "cut_off", "no_reward", "no_baseline"
]


@dataclass
class Sample:
    """One response to one prompt; the ``n_samples_per_prompt`` samples of a prompt share a group.

    ``response_tokens`` and ``rollout_logprobs`` are aligned: ``rollout_logprobs[i]`` is the
    log-probability the rollout engine gave ``response_tokens[i]`` when it sampled it (needed for
    truncated importance sampling).
    """

    prompt: str | list[dict[str, str]]
    label: str | None
    metadata: dict[str, Any]
    group_id: int
    index: int = 0
    prompt_tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_tokens: list[int] = field(default_factory=list)
    rollout_logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    weight_version: int | None = None
    reward: float | None = None
    status: RewardStatus = "pending"
    reward_details: dict[str, Any] = field(default_factory=dict)
    advantage: float = 0.0
    #: ``--keep-cut-off``: a response cut off at the length limit trains like a finished one
    #: (the rollout copies the run's setting here; the rule itself is :attr:`left_out`)
    keep_cut_off: bool = False
    #: with a group deadline: the group was left with fewer than two scored responses, so this
    #: one has no baseline to be compared with and trains nothing (``rl_core.group_deadline``)
    no_baseline: bool = False

    @property
    def tokens(self) -> list[int]:
        """Prompt and response token ids, the sequence the trainer scores."""
        return self.prompt_tokens + self.response_tokens

    @property
    def response_length(self) -> int:
        return len(self.response_tokens)

    @property
    def cut_off(self) -> bool:
        """The response hit the length limit (``--rollout-max-response-len``) before it ended."""
        return self.finish_reason == "length"

    @property
    def left_out(self) -> LeftOut | None:
        """Why the sample stays out of the loss and of its group's mean and std, or None when it
        is in: the one membership rule of both.

        A judge failure, a response not judged by its group's deadline, an aborted generation,
        an empty response and a sample without a reward are never in; nor, with a deadline, the
        lone scored response of a group (``no_baseline``). Nor, unless ``keep_cut_off``, is a
        response cut off at the length limit: it is judged and counted, but its verdict is on an
        answer the policy never finished (a 0 for a right start, or a 1 for a leading number
        followed by garbage), and it would pull its group's mean and std.
        """
        if self.status == "judge_error":
            return "judge_error"
        if self.status == "judge_timeout":
            return "judge_timeout"
        if self.status == "aborted":
            return "aborted"
        if self.response_length == 0:
            return "empty"
        if self.cut_off and not self.keep_cut_off:
            return "cut_off"
        if self.reward is None:
            return "no_reward"
        if self.no_baseline:
            return "no_baseline"
        return None

    @property
    def in_loss(self) -> bool:
        """Whether the sample takes part in the loss and its group's baseline (:attr:`left_out`
        says why not)."""
        return self.left_out is None

    def apply_reward(self, result: dict[str, Any], reward_key: str = "score") -> None:
        """Store a reward function's result; a missing/None score is a judge error (or the
        deadline's ``judge_timeout``), never a 0."""
        status = result.get("status", "ok")
        score = result.get(reward_key)
        self.reward_details = dict(result)
        if status == "judge_error" or score is None:
            self.reward = None
            self.status = status if status in ("deferred", "judge_timeout") else "judge_error"
            return
        if isinstance(score, bool) or not isinstance(score, int | float):
            raise TypeError(
                f"reward key {reward_key!r} must be a number or None, got {score!r} "
                f"(result keys: {sorted(result)})"
            )
        self.reward = float(score)
        self.status = status


def accuracy(sample: Sample) -> float | None:
    """Whether the sample is right, 1.0 or 0.0 (the reward's ``acc``, else its reward over
    0.5); None without a reward."""
    if sample.reward is None:
        return None
    acc = sample.reward_details.get("acc")
    if isinstance(acc, int | float) and not isinstance(acc, bool):
        return float(acc)
    return 1.0 if sample.reward > 0.5 else 0.0
