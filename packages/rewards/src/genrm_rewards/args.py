"""The settings the reward functions read from the trainer's ``args``.

Reward functions receive the trainer's own config object (argparse ``Namespace``, rl-core's
config, anything with attributes). They never assume it has our fields: ``resolve_args`` reads
each documented attribute with ``getattr(args, name, default)`` (``None`` also means "default",
as argparse leaves unset flags at ``None``), validates the lot into the frozen ``RewardArgs``,
and turns a bad value into a ``RewardConfigError`` naming the attribute, the value and the rule.
JSON strings are accepted for the dict-valued settings, as they arrive from a command line.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from genrm_client.types import SamplingParams
from genrm_rewards.errors import RewardConfigError
from genrm_rewards.limits import RULE_TIMEOUT_S

__all__ = ["RewardArgs", "resolve_args"]


class RewardArgs(BaseModel):
    """Every setting a built-in reward function reads (all optional, defaults shown)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: dapo-genrm / math judge instance; ``None`` → the service's ``"__default__"`` instance.
    genrm_route_key: str | None = None
    #: request-level sampling overrides sent with every judge call (instance config otherwise).
    reward_sampling_params: SamplingParams | None = None
    #: rule gate: math-verify proves the answer equals the label → 1.0 without a judge call.
    rule_gate: bool = False
    #: rule audit: math-verify also checks every judged answer (without deciding the reward),
    #: recorded as the result's ``rule``, so a run can say how often the judge agrees with it.
    rule_audit: bool = False
    #: deadline of one math-verify check (gate and ``math``), enforced outside math-verify.
    rule_timeout_s: float = Field(default=RULE_TIMEOUT_S, gt=0)
    #: reuse verdicts per (question, label, normalised answer, route) within the process.
    verdict_cache: bool = True
    verdict_cache_size: int = Field(default=65536, ge=1)
    #: most requests per ``generate_batch`` call; bigger batches go out as concurrent chunks.
    judge_batch_size: int = Field(default=64, ge=1)
    #: accept "1.", "**1**", "Yes", "Judgement: 0", ... as verdicts (strict "1"/"0" otherwise).
    lenient_verdict: bool = False
    #: ``strict``: the reply text is parsed (score 1.0 or 0.0); ``logprob``: the score is the
    #: judge's ``P("1") / (P("1") + P("0"))`` at its first reply token (a soft score in [0, 1];
    #: needs thinking off and an engine that reports it, the hf engine).
    genrm_verdict: Literal["strict", "logprob"] = "strict"
    #: the policy's answer is cut to this many characters before it reaches the judge prompt.
    max_answer_chars: int = Field(default=2000, ge=16)
    #: cap on a whole response quoted to a judge (dual safety judge, agentic step texts).
    max_response_chars: int = Field(default=8000, ge=16)
    #: defer mode (``--rm-type dummy``): the reward the post-process hook scores the batch with.
    deferred_rm_type: str = "dapo-genrm"
    #: dual judges: the two instances and how their verdicts combine into one score.
    dual_quality_route_key: str = "quality"
    dual_safety_route_key: str = "safety"
    dual_combine: Literal["product", "weighted_sum", "min"] = "product"
    #: (quality, safety) weights for ``weighted_sum``.
    dual_weights: tuple[float, float] = (0.5, 0.5)
    #: agentic judges: trajectory step ``module`` → route_key, and the aggregation of steps.
    agentic_route_keys: dict[str, str] = Field(default_factory=dict)
    agentic_aggregation: Literal["mean", "min", "last"] = "mean"
    #: rubric-genrm: the run's rubric, a JSON file (``[{"criterion", "weight"}, ...]``), used for
    #: every record whose metadata has no rubric of its own (``rubric_key``).
    rubric_path: str | None = None
    #: rubric-genrm: the metadata key of a record's own rubric (it wins over ``rubric_path``).
    rubric_key: str = Field(default="rubric", min_length=1)
    #: rubric-genrm: the share of a rubric's weight whose criteria must have been judged for the
    #: sample to be scored (over the judged ones); below it the sample is a ``judge_error``.
    #: 1.0: any failed criterion call makes the sample a ``judge_error``.
    rubric_min_answered_weight: float = Field(default=1.0, gt=0.0, le=1.0)
    #: judge panel (dapo-genrm, rubric-genrm): every judge question is asked of each of these
    #: route keys (``"a,b,c"`` or a JSON list) instead of ``genrm_route_key``, and aggregated.
    judge_panel: tuple[str, ...] | None = None
    judge_panel_aggregate: Literal["mean", "majority", "min", "unanimity"] = "mean"
    #: the fewest members that must answer; failed members are then left out. ``None``: every
    #: member must answer, else the question is a ``judge_error``.
    judge_panel_quorum: int | None = Field(default=None, ge=1)
    #: pairwise-genrm: which pairs of a group are compared (``all``: every pair; ``round-robin``:
    #: ``pairwise_rounds`` rounds of a round robin, each response meeting one other per round).
    pairwise_pairing: Literal["all", "round-robin"] = "all"
    pairwise_rounds: int = Field(default=2, ge=1)
    #: ask each pair in both orders (A/B and B/A), so a judge's first-position bias cancels.
    pairwise_both_orders: bool = True
    #: how the outcomes become one score per response: win rate, or Bradley–Terry strength.
    pairwise_score: Literal["win_rate", "bradley_terry"] = "win_rate"
    #: a response with fewer answered comparisons than this is a judge_error (never 0).
    pairwise_min_comparisons: int = Field(default=1, ge=1)
    #: a group's judging stops this long after its last response arrives; what is not judged
    #: by then is ``judge_timeout`` (left out, never 0). ``None``: no deadline.
    group_judge_deadline_s: float | None = Field(default=None, gt=0)

    @field_validator("judge_panel", mode="before")
    @classmethod
    def _panel_members(cls, value: Any) -> Any:
        """``"a,b"`` (a command line) or a JSON list; members unique and non-empty."""
        if isinstance(value, str):
            text = value.strip()
            value = json.loads(text) if text.startswith("[") else text.split(",")
            value = [str(v).strip() for v in value]
        if value is None:
            return None
        members = list(value)
        if len(members) < 2 or any(not isinstance(m, str) or not m for m in members):
            raise ValueError(f"a judge panel is two or more route keys, got {members!r}")
        if len(set(members)) != len(members):
            raise ValueError(f"a judge panel names each route key once, got {members!r}")
        return tuple(members)

    @model_validator(mode="after")
    def _panel_settings(self) -> RewardArgs:
        panel = self.judge_panel
        if self.judge_panel_quorum is not None:
            if panel is None:
                raise ValueError(
                    f"judge_panel_quorum={self.judge_panel_quorum} needs a judge_panel"
                )
            if self.judge_panel_quorum > len(panel):
                raise ValueError(
                    f"judge_panel_quorum={self.judge_panel_quorum} is more than the "
                    f"{len(panel)} members of judge_panel={list(panel)}"
                )
        if panel is not None and self.genrm_route_key is not None:
            raise ValueError(
                f"judge_panel={list(panel)} and genrm_route_key={self.genrm_route_key!r} both "
                "name the judge: set one (a panel asks each of its members instead)"
            )
        return self


_JSON_FIELDS = frozenset({"reward_sampling_params", "agentic_route_keys", "dual_weights"})


def resolve_args(args: Any) -> RewardArgs:
    """Read the documented settings from any attribute-bearing ``args`` into ``RewardArgs``.

    Raises:
        RewardConfigError: a present attribute has an invalid value (names key, value, rule).
    """
    if isinstance(args, RewardArgs):
        return args
    values: dict[str, Any] = {}
    if args is not None:
        for name in RewardArgs.model_fields:
            value = getattr(args, name, None)
            if value is None:
                continue
            if name in _JSON_FIELDS and isinstance(value, str):
                try:
                    value = json.loads(value)
                except json.JSONDecodeError as err:
                    raise RewardConfigError(
                        f"args.{name}={value!r} is not valid JSON: {err.msg}"
                    ) from err
            values[name] = value
    try:
        settings = RewardArgs.model_validate(values)
    except ValidationError as err:
        first = err.errors()[0]
        if not first["loc"]:  # a rule across settings: its message names them
            raise RewardConfigError(str(first["msg"]).removeprefix("Value error, ")) from err
        key = ".".join(str(p) for p in first["loc"])
        top = str(first["loc"][0]) if first["loc"] else key
        raise RewardConfigError(
            f"args.{key}={values.get(top)!r} is invalid: {first['msg']}"
        ) from err
    params = settings.reward_sampling_params
    kwargs = (params.chat_template_kwargs if params else None) or {}
    if settings.genrm_verdict == "logprob" and kwargs.get("enable_thinking"):
        raise RewardConfigError(
            "args.genrm_verdict='logprob' needs thinking off, but "
            f"args.reward_sampling_params.chat_template_kwargs={kwargs!r}: the first reply token "
            "of a thinking judge is a thought, not a verdict"
        )
    return settings
