"""``rl-core train`` configuration: the original's flag names, one frozen, validated model.

The flags keep the names of the original (``relax/entrypoints/train.py``, itself slime's) so its
launch scripts translate one to one. argparse only reads them; everything after that sees a frozen
pydantic ``TrainConfig`` — never a mutable Namespace that phases write into. Sources, lowest
priority first: the flags' defaults, ``--preset``, ``--config FILE`` (YAML or JSON, keys are flag
names with or without the dashes), then the command line. A bad value is rejected before anything
starts, with the flag, the value and the rule.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from genrm_rewards.args import RewardArgs
from genrm_serve import InstanceSpec
from rl_core.backends.base import BackendConfig
from rl_core.backends.megatron.parallel import (
    MegatronConfig,
    add_megatron_args,
    megatron_config_from,
)
from rl_core.generated import GENERATED_SETS
from rl_core.grpo.loss import LossConfig
from rl_core.limits import PLACEMENT_TIMEOUT_S
from rl_core.placement import (
    LayoutRequest,
    PlacementError,
    PlacementPlan,
    add_placement_args,
    layout_from_args,
    plan_layout,
)
from rl_core.placement.sglang_flags import pop_sglang_overrides

#: The embedded Gemma 3 270M (genrm-serve's cached safetensors copy), for policy or judge.
EMBEDDED_MODEL = "embedded:gemma3-270m"
#: ``--prompt-data`` values that generate a data set instead of reading a file.
GENERATED_DATA = tuple(GENERATED_SETS)


#: reward settings whose values are JSON on a command line (dicts, pairs, sampling params)
_JSON_REWARD_FIELDS = ("reward_sampling_params", "agentic_route_keys", "dual_weights")


class ConfigError(ValueError):
    """An invalid training configuration; the message names the flag, the value and the rule."""


class TrainConfig(RewardArgs):
    """Everything ``rl-core train`` needs, validated: one tree, parsed once.

    Flat fields are the flags (their defaults are the flags' defaults: argparse reads them from
    here). The reward settings are inherited from genrm-rewards' ``RewardArgs``, so reward
    functions, which read ``args.<setting>``, see every one of them. ``layout`` and ``plan`` are
    the placement request and its plan, built once at parse time; ``backend`` and ``rewards`` are
    views for the training backend and the reward functions.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # policy and backend
    hf_checkpoint: str
    train_backend: Literal["torch", "megatron"] = "torch"
    #: ``--train-backend megatron``: tensor / pipeline / sequence parallelism (Megatron's flags)
    megatron: MegatronConfig = Field(default_factory=MegatronConfig)
    #: where compute runs; placement still uses the cluster's GPU bundles (``--device cpu`` on a
    #: cluster of logical GPUs runs every layout for real on a CPU machine).
    device: Literal["auto", "cpu", "cuda"] = "auto"
    bf16: bool | None = False  # None = auto: bf16 only where the device has it natively
    max_tokens_per_gpu: int = Field(default=4096, gt=0)
    logprob_chunk_size: int = Field(default=256, gt=0)
    # GRPO
    advantage_estimator: Literal["grpo"] = "grpo"
    grpo_std_normalization: bool = True
    use_kl_loss: bool = False
    kl_loss_coef: float = Field(default=0.0, ge=0.0)
    kl_loss_type: Literal["low_var_kl", "k1", "k2"] = "low_var_kl"
    eps_clip: float = Field(default=0.2, gt=0.0, lt=1.0)
    eps_clip_high: float | None = Field(default=None, gt=0.0)
    use_tis: bool = False
    tis_clip: float = Field(default=2.0, ge=1.0)
    tis_clip_low: float = Field(default=0.0, ge=0.0, le=1.0)
    #: train on responses cut off at --rollout-max-response-len too (by default they are judged
    #: and counted, but stay out of the loss and of their group's mean and std)
    keep_cut_off: bool = False
    #: stop the run after this many steps in a row in which no sample was in the loss
    max_untrained_steps: int = Field(default=3, gt=0)
    # optimizer
    optimizer: Literal["adam"] = "adam"
    lr: float = Field(default=1e-6, gt=0.0)
    min_lr: float = Field(default=0.0, ge=0.0)
    lr_decay_style: Literal["constant", "linear", "cosine"] = "constant"
    lr_warmup_iters: int = Field(default=0, ge=0)
    lr_decay_iters: int | None = Field(default=None, gt=0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    adam_beta1: float = Field(default=0.9, gt=0.0, lt=1.0)
    adam_beta2: float = Field(default=0.98, gt=0.0, lt=1.0)
    clip_grad: float = Field(default=1.0, gt=0.0)
    # rollout
    num_rollout: int = Field(default=1, gt=0)
    rollout_batch_size: int = Field(default=8, gt=0)
    n_samples_per_prompt: int = Field(default=8, gt=0)
    global_batch_size: int | None = Field(default=None, gt=0)
    rollout_max_response_len: int = Field(default=1024, gt=0)
    rollout_max_prompt_len: int | None = Field(default=None, gt=0)
    rollout_temperature: float = Field(default=1.0, gt=0.0)
    rollout_top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    rollout_top_k: int = Field(default=-1, ge=-1)
    rollout_stop: list[str] | None = None
    rollout_shuffle: bool = True
    seed: int = 1234
    # data
    prompt_data: str
    eval_prompt_data: str | None = None
    input_key: str = "prompt"
    label_key: str = "label"
    apply_chat_template: bool = False
    strict_data: bool = False
    n_samples_per_eval_prompt: int = Field(default=1, gt=0)
    eval_max_response_len: int | None = Field(default=None, gt=0)
    eval_temperature: float | None = Field(default=None, ge=0.0)
    eval_interval: int | None = Field(default=None, gt=0)
    eval_limit: int | None = Field(default=None, gt=0)
    #: also evaluate before the first step and after the last: whether training helped
    eval_before_and_after: bool = False
    # rewards (the reward functions' own settings are inherited from RewardArgs)
    rm_type: str | None = None
    reward_key: str = "score"
    custom_rm_path: str | None = None
    defer_reward_to_post_process: bool = False
    custom_reward_post_process_path: str | None = None
    reward_concurrency: int = Field(default=32, gt=0)
    max_judge_error_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    # judges (genrm-serve's parser) and placement (built once from the placement flags)
    genrm_instances: dict[str, InstanceSpec] = Field(default_factory=dict)
    #: the judge service's HTTP port on the driver's node; None = a free port
    genrm_port: int | None = Field(default=None, gt=0, le=65535)
    layout: LayoutRequest
    plan: PlacementPlan
    # checkpoints and output
    save: str | None = None
    save_interval: int | None = Field(default=None, gt=0)
    #: keep only the newest N checkpoints of --save (None: keep every one)
    save_keep: int | None = Field(default=None, gt=0)
    #: at the end of the run, the final policy as a Hugging Face model folder (``rl_core.export``)
    save_hf: str | None = None
    save_hf_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    load: str | None = None
    #: with --save: a lost trainer rank (or another process the run cannot re-create in place)
    #: restarts the run from its last checkpoint, at most this many times (``rl_core.restarts``)
    max_restarts: int = Field(default=3, ge=0)
    #: a restart after a lost node waits this long for the cluster to hold the plan again (a
    #: node that comes back, or one the autoscaler adds), then ends the run with one line
    restart_wait_s: float = Field(default=PLACEMENT_TIMEOUT_S, gt=0)
    run_dir: str = "runs/latest"
    #: a fresh run into a --run-dir holding another run's metrics: replace them (else refused)
    overwrite_run_dir: bool = False
    preset: str | None = None
    # Weights & Biases (``rl_core.wandb_mirror``; slime's flag names), the ``wandb`` extra
    use_wandb: bool = False
    wandb_project: str | None = None
    wandb_team: str | None = None
    wandb_group: str | None = None
    #: default: the --run-dir folder's name
    wandb_run_name: str | None = None
    #: resume (or name) this W&B run id; a resumed training run passes its first run's id
    wandb_run_id: str | None = None
    wandb_mode: Literal["online", "offline", "disabled"] = "online"
    #: where W&B writes its run folder (default: --run-dir)
    wandb_dir: str | None = None
    #: a W&B server other than the public one (its base URL)
    wandb_host: str | None = None

    @field_validator(*_JSON_REWARD_FIELDS, mode="before")
    @classmethod
    def _json_string(cls, value: Any) -> Any:
        """Dict-valued reward settings arrive as JSON strings from a command line."""
        return json.loads(value) if isinstance(value, str) else value

    @property
    def train_batch_size(self) -> int:
        """Samples per optimizer step (``--global-batch-size``, default: the whole rollout)."""
        return self.global_batch_size or self.rollout_batch_size * self.n_samples_per_prompt

    @property
    def genrm_enabled(self) -> bool:
        return bool(self.genrm_instances)

    @property
    def mode(self) -> str:
        return str(self.plan.mode)

    @property
    def rewards(self) -> RewardArgs:
        """The reward functions' settings alone."""
        return RewardArgs.model_validate({k: getattr(self, k) for k in RewardArgs.model_fields})

    @property
    def backend(self) -> BackendConfig:
        """The training backend's settings (optimizer, batching, loss)."""
        return BackendConfig(
            lr=self.lr,
            min_lr=self.min_lr,
            lr_decay_style=self.lr_decay_style,
            lr_warmup_iters=self.lr_warmup_iters,
            lr_decay_iters=self.lr_decay_iters,
            weight_decay=self.weight_decay,
            adam_beta1=self.adam_beta1,
            adam_beta2=self.adam_beta2,
            clip_grad=self.clip_grad,
            max_tokens_per_micro_batch=self.max_tokens_per_gpu,
            logprob_chunk_size=self.logprob_chunk_size,
            bf16=self.bf16,
            temperature=self.rollout_temperature,
            seed=self.seed,
            loss=LossConfig(
                eps_clip=self.eps_clip,
                eps_clip_high=self.eps_clip_high,
                use_kl_loss=self.use_kl_loss,
                kl_loss_coef=self.kl_loss_coef,
                kl_loss_type=self.kl_loss_type,
                use_tis=self.use_tis,
                tis_clip=self.tis_clip,
                tis_clip_low=self.tis_clip_low,
            ),
        )

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        total = self.rollout_batch_size * self.n_samples_per_prompt
        if self.advantage_estimator == "grpo" and self.n_samples_per_prompt < 2:
            raise ValueError(
                f"--n-samples-per-prompt {self.n_samples_per_prompt}: GRPO needs at least 2 "
                "samples per prompt (a group of 1 has no baseline)"
            )
        if total % self.train_batch_size:
            raise ValueError(
                f"--global-batch-size {self.train_batch_size} must divide --rollout-batch-size × "
                f"--n-samples-per-prompt = {total}"
            )
        if self.eps_clip_high is not None and self.eps_clip_high < self.eps_clip:
            raise ValueError(
                f"--eps-clip-high {self.eps_clip_high} must be ≥ --eps-clip {self.eps_clip}"
            )
        if self.save_interval is not None and self.save is None:
            raise ValueError(f"--save-interval {self.save_interval} needs --save DIR")
        if self.save_keep is not None and self.save is None:
            raise ValueError(f"--save-keep {self.save_keep} needs --save DIR")
        if self.save_hf_dtype != "bf16" and self.save_hf is None:
            raise ValueError(f"--save-hf-dtype {self.save_hf_dtype} needs --save-hf DIR")
        if self.lr_decay_style != "constant" and self.lr_decay_iters is None:
            raise ValueError(f"--lr-decay-style {self.lr_decay_style} needs --lr-decay-iters")
        if not self.use_wandb:
            for name in _WANDB_FIELDS:
                value = getattr(self, name)
                if value != TrainConfig.model_fields[name].default:
                    flag = "--" + name.replace("_", "-")
                    raise ValueError(f"{flag} {value} needs --use-wandb")
        return self


#: The W&B settings that mean something only with ``--use-wandb``.
_WANDB_FIELDS = (
    "wandb_project",
    "wandb_team",
    "wandb_group",
    "wandb_run_name",
    "wandb_run_id",
    "wandb_mode",
    "wandb_dir",
    "wandb_host",
)


# --- presets -------------------------------------------------------------------------------------

#: ``--preset cpu-demo``: the README's main job on a 2-core CPU machine (< 10 minutes).
PRESETS: dict[str, dict[str, Any]] = {
    "cpu-demo": {
        "hf_checkpoint": EMBEDDED_MODEL,
        "genrm_model_path": EMBEDDED_MODEL,
        "genrm_engine": "hf",
        "genrm_sampling_config": json.dumps({"max_response_len": 2, "temperature": 0.0}),
        "genrm_engine_config": json.dumps({"max_context_len": 2048, "max_batch_size": 16}),
        "prompt_data": "gen:easy-math",
        "eval_prompt_data": "gen:easy-math-eval",
        "eval_limit": 16,
        "eval_interval": 3,
        "eval_before_and_after": True,
        "eval_max_response_len": 4,
        "eval_temperature": 0.0,
        "rm_type": "dapo-genrm",
        # math-verify first (an answer it proves equal is 1.0 without a judge call: the small
        # judge's false 0s on right answers never reach the loss), the judge for the rest, and
        # math-verify audits every judged answer: the summary says per step how often the two
        # agree where math-verify can decide. --no-rule-gate lets the judge decide everything.
        "rule_gate": True,
        "rule_audit": True,
        "num_rollout": 3,
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 4,
        "rollout_max_response_len": 4,
        "rollout_temperature": 1.0,
        "rollout_stop": ["\n"],
        "lr": 2e-6,
        "weight_decay": 0.1,
        "eps_clip": 0.2,
        "eps_clip_high": 0.28,
        "use_tis": True,
        # auto: bf16 autocast only on a CPU with native bf16 (>100x slower emulated on AVX2)
        "bf16": None,
        "max_tokens_per_gpu": 1024,
        "colocate": True,
        # The GPU layout this job would have (colocate split); on a CPU machine the plan decides
        # the phases (rollout and judge sleep while the actor trains) and is not realised.
        "resource": json.dumps({"actor": [1, 2], "rollout": [1, 1], "genrm": [1, 1]}),
        "run_dir": "runs/cpu-demo",
    },
}


# --- argparse: every default comes from TrainConfig's fields ------------------------------------


def _field_flag_kwargs(name: str) -> dict[str, Any]:
    """argparse settings for the field ``name``: its default, and a type from its annotation."""
    field = TrainConfig.model_fields[name]
    default = None if field.is_required() else field.get_default(call_default_factory=True)
    annotation = field.annotation
    args = [a for a in get_args(annotation) if a is not type(None)]
    if annotation is bool or (get_origin(annotation) in (UnionType, Union) and args == [bool]):
        return {"action": argparse.BooleanOptionalAction, "default": default}
    if get_origin(annotation) is Literal:
        return {"choices": list(get_args(annotation)), "default": default}
    base = (
        args[0] if get_origin(annotation) in (UnionType, Union) and len(args) == 1 else annotation
    )
    if base in (int, float, str):
        return {"type": base, "default": default}
    # dicts, tuples, models: a JSON string, validated by the model
    return {"type": str, "default": None if default is None else json.dumps(default)}


def _flag(g: Any, flag: str, *aliases: str, dest: str | None = None, **kw: Any) -> None:
    """Add ``flag`` with the default and type of its TrainConfig field (``kw`` may add help)."""
    name = dest or flag.lstrip("-").replace("-", "_")
    settings = _field_flag_kwargs(name) | kw
    g.add_argument(flag, *aliases, dest=name, **settings)


DESCRIPTION = "GRPO with generative-reward-model (GenRM) judges."


def build_parser() -> argparse.ArgumentParser:
    """The ``rl-core train`` parser (original flag names)."""
    p = argparse.ArgumentParser(
        prog="rl-core train",
        description=DESCRIPTION,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_train_args(p)
    return p


def add_train_args(p: argparse.ArgumentParser) -> None:
    """Add every ``rl-core train`` flag to ``p``."""
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="a ready-made job")
    p.add_argument("--config", default=None, help="YAML/JSON file of flag values")

    g = p.add_argument_group("policy and training backend")
    _flag(g, "--hf-checkpoint", help=f"policy model (or {EMBEDDED_MODEL})")
    _flag(g, "--train-backend", help="torch (transformers) or megatron (megatron-core)")
    _flag(g, "--device", help="where compute runs (placement still uses GPU bundles)")
    _flag(g, "--bf16", help="bf16 autocast (a CPU without native bf16 uses fp32 and warns)")
    _flag(g, "--max-tokens-per-gpu", help="micro-batch token budget")
    _flag(g, "--logprob-chunk-size")

    g = p.add_argument_group("GRPO")
    _flag(g, "--advantage-estimator")
    g.add_argument(
        "--disable-grpo-std-normalization",
        dest="grpo_std_normalization",
        action="store_false",
        default=TrainConfig.model_fields["grpo_std_normalization"].default,
        help="only subtract the group mean",
    )
    _flag(g, "--use-kl-loss", help="add a KL term to a frozen reference")
    for name in ("kl_loss_coef", "kl_loss_type", "eps_clip", "eps_clip_high"):
        _flag(g, "--" + name.replace("_", "-"))
    _flag(g, "--use-tis", help="truncated importance sampling with rollout log-probs")
    _flag(g, "--tis-clip")
    _flag(g, "--tis-clip-low")
    _flag(
        g,
        "--keep-cut-off",
        help="train on responses cut off at --rollout-max-response-len (by default they are "
        "judged but kept out of the loss and of their group's mean / std)",
    )
    _flag(
        g,
        "--max-untrained-steps",
        help="stop the run after this many steps in a row with no sample in the loss",
    )

    g = p.add_argument_group("optimizer")
    for name in (
        "optimizer",
        "lr",
        "min_lr",
        "lr_decay_style",
        "lr_warmup_iters",
        "lr_decay_iters",
        "weight_decay",
        "adam_beta1",
        "adam_beta2",
        "clip_grad",
    ):
        _flag(g, "--" + name.replace("_", "-"))

    g = p.add_argument_group("rollout")
    _flag(g, "--num-rollout", "--num-steps")
    _flag(g, "--rollout-batch-size", help="prompts per step")
    _flag(g, "--n-samples-per-prompt")
    _flag(g, "--global-batch-size", help="samples per optimizer step")
    for name in (
        "rollout_max_response_len",
        "rollout_max_prompt_len",
        "rollout_temperature",
        "rollout_top_p",
        "rollout_top_k",
    ):
        _flag(g, "--" + name.replace("_", "-"))
    g.add_argument("--rollout-stop", nargs="*", default=None)
    _flag(g, "--rollout-shuffle", help="shuffle prompts each epoch")
    _flag(g, "--seed")

    g = p.add_argument_group("data")
    _flag(g, "--prompt-data", help=f"jsonl, or one of {GENERATED_DATA}")
    _flag(g, "--eval-prompt-data", help="AIME-format jsonl")
    _flag(g, "--input-key")
    _flag(g, "--label-key")
    _flag(g, "--apply-chat-template", help="render chat prompts with the tokenizer's template")
    _flag(g, "--strict-data", help="a bad record is fatal instead of skipped")
    for name in (
        "n_samples_per_eval_prompt",
        "eval_max_response_len",
        "eval_temperature",
        "eval_interval",
    ):
        _flag(g, "--" + name.replace("_", "-"))
    _flag(g, "--eval-limit", help="evaluate on the first N only")
    _flag(
        g,
        "--eval-before-and-after",
        help="evaluate before the first step and after the last too (with --eval-prompt-data)",
    )

    g = p.add_argument_group("rewards")
    _flag(g, "--reward-key")
    _flag(g, "--custom-rm-path", help="module.func")
    _flag(g, "--reward-concurrency")
    _flag(
        g,
        "--max-judge-error-fraction",
        help="stop the run when a larger share of a step's samples has no reward",
    )
    # every setting the reward functions read (genrm-rewards' RewardArgs), one flag each
    for name in RewardArgs.model_fields:
        _flag(g, "--" + name.replace("_", "-"), help="reward setting (see genrm-rewards)")

    add_megatron_args(p)

    # --resource, --colocate / --fully-async, rollout GPU flags, --rm-type and the defer flags,
    # and genrm-serve's --genrm-* flags: one definition, shared with `rl-core plan`.
    add_placement_args(p)
    g = p.add_argument_group("judge service")
    _flag(g, "--genrm-port", help="HTTP port of the judge service (default: a free port)")

    g = p.add_argument_group("checkpoints and output")
    _flag(
        g,
        "--save",
        help="folder of checkpoints (step_NNNNNN/ and a 'latest' file); a stopped run saves "
        "its last completed step there",
    )
    _flag(
        g,
        "--save-interval",
        help="with --save: save every N steps too (the last step is always saved)",
    )
    _flag(g, "--save-keep", help="keep only the newest N checkpoints (default: all)")
    _flag(
        g,
        "--save-hf",
        help="at the end, write the final policy as a Hugging Face model folder (new or empty)",
    )
    _flag(g, "--save-hf-dtype", help="the --save-hf weights' dtype")
    _flag(
        g,
        "--load",
        help="resume from a checkpoint: a --save folder (its latest step) or one step_* folder",
    )
    _flag(
        g,
        "--max-restarts",
        help="with --save: a lost trainer rank (or another process that cannot be re-created "
        "in place) restarts the run from its last checkpoint by itself, in this process, at "
        "most N times in all; every step is still recorded once. 3 rides out the odd "
        "preemption or OOM kill, and a cause that comes back every time ends the run after "
        "3 tries. 0, without --save, or with none left: the run ends with one line naming "
        "the lost process, Ray's cause and the command that resumes",
    )
    _flag(
        g,
        "--restart-wait-s",
        help="a restart waits up to this long for the cluster to hold the plan again (after "
        "a lost node: one that comes back, or one the autoscaler adds), saying every few "
        "seconds what it waits for; past it the run ends with one line and the command that "
        "resumes",
    )
    _flag(g, "--run-dir", help="metrics, TensorBoard, plots")
    _flag(
        g,
        "--overwrite-run-dir",
        help="a fresh run into a --run-dir that holds another run's metrics: remove its "
        "metrics, samples and TensorBoard events first (without it such a run is refused)",
    )

    g = p.add_argument_group("Weights & Biases (the genrm-rl-core[wandb] extra)")
    _flag(
        g,
        "--use-wandb",
        help="also log the run to W&B: every metric of metrics.jsonl, each step's samples as a "
        "table, the curves",
    )
    _flag(g, "--wandb-project", help="W&B project (default: genrm)")
    _flag(g, "--wandb-team", "--wandb-entity", help="W&B team (entity)")
    _flag(g, "--wandb-group", help="W&B group of runs")
    _flag(
        g, "--wandb-run-name", "--wandb-exp-name", help="W&B run name (default: --run-dir's name)"
    )
    _flag(g, "--wandb-run-id", help="W&B run id: resumes that run when it exists")
    _flag(
        g,
        "--wandb-mode",
        help="online; offline (no network: upload later with `wandb sync`); disabled",
    )
    _flag(g, "--wandb-dir", help="where W&B writes its run folder (default: --run-dir)")
    _flag(g, "--wandb-host", help="base URL of a W&B server other than the public one")


def _file_values(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"--config {path}: not valid YAML/JSON: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: must be a mapping of flag names to values")
    dests = {a.dest for a in parser._actions}
    out = {}
    for key, value in data.items():
        dest = str(key).lstrip("-").replace("-", "_")
        if dest not in dests or dest in ("config", "help"):
            raise ConfigError(f"--config {path}: unknown key {key!r} (not a train flag)")
        if (dest.startswith("genrm_") or dest in _JSON_REWARD_FIELDS) and isinstance(
            value, dict | list
        ):
            value = json.dumps(value)
        out[dest] = value
    return out


def parse_train_args(argv: Sequence[str] | None = None) -> TrainConfig:
    """Parse flags (+ preset + config file) into a validated ``TrainConfig``, plan included.

    A wrong layout is caught here, before any model loads or Ray starts.
    """
    ns, overrides = parse_train_namespace(sys.argv[1:] if argv is None else argv)
    return config_from_namespace(ns, sglang_overrides=overrides)


def parse_train_namespace(
    argv: Sequence[str], *, prog: str = "rl-core train"
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """The flags of a train command line with ``--preset`` and ``--config`` applied under them,
    and its SGLang server overrides: the one parsing path of ``rl-core train`` and of
    ``rl-core plan --preset/--config``, so the plan printed is the plan train runs."""
    parser = build_parser()
    parser.prog = prog
    known = {opt for action in parser._actions for opt in action.option_strings}
    try:
        argv, overrides = pop_sglang_overrides(list(argv), known)
    except PlacementError as err:
        raise ConfigError(str(err)) from err
    first, _ = parser.parse_known_args(argv)
    defaults: dict[str, Any] = {}
    if first.preset:
        defaults.update(PRESETS[first.preset])
    if first.config:
        defaults.update(_file_values(first.config, parser))
    parser.set_defaults(**defaults)
    return parser.parse_args(argv), dict(overrides)


def build_config(**values: Any) -> TrainConfig:
    """A ``TrainConfig`` from flag values by their Python names (``lr=1e-3``, ``colocate=True``,
    ``resource='{"actor": [1, 2], ...}'``): the command line's defaults and checks, plan included,
    without a command line (launchers, notebooks, tests)."""
    parser = build_parser()
    dests = {a.dest for a in parser._actions}
    unknown = sorted(set(values) - dests)
    if unknown:
        raise ConfigError(f"unknown setting(s) {unknown} (not train flags)")
    parser.set_defaults(**values)
    return config_from_namespace(parser.parse_args([]))


def config_from_namespace(
    ns: argparse.Namespace, *, sglang_overrides: Mapping[str, Any] | None = None
) -> TrainConfig:
    """The validated config of parsed flags (``ns`` is read, never changed), plan included."""
    for flag in ("hf_checkpoint", "prompt_data"):
        if getattr(ns, flag) is None:
            raise ConfigError(f"--{flag.replace('_', '-')} is required (or use --preset cpu-demo)")
    if ns.rm_type is None and ns.custom_rm_path is None:
        raise ConfigError("set --rm-type (e.g. dapo-genrm, math, dummy) or --custom-rm-path")
    try:
        layout = layout_from_args(ns, sglang_overrides=sglang_overrides)
        plan = plan_layout(layout)
    except PlacementError as err:
        raise ConfigError(str(err)) from err
    values = {k: v for k, v in vars(ns).items() if k in TrainConfig.model_fields}
    values.update(genrm_instances=dict(layout.genrm), layout=layout, plan=plan)
    if ns.train_backend == "megatron":
        values["megatron"] = _megatron(ns, plan)
    if ns.use_wandb:
        from rl_core.wandb_mirror import WandbNotInstalledError, require_wandb

        try:
            require_wandb()  # refused here, before Ray starts
        except WandbNotInstalledError as err:
            raise ConfigError(str(err)) from err
    try:
        return TrainConfig(**values)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            loc = ".".join(str(x) for x in e["loc"])
            msg = e["msg"].removeprefix("Value error, ")
            if loc:
                lines.append(f"--{loc.replace('_', '-')} = {e.get('input')!r}: {msg}")
            else:
                lines.append(msg)
        raise ConfigError("invalid training configuration:\n  " + "\n  ".join(lines)) from err


def _megatron(ns: argparse.Namespace, plan: PlacementPlan) -> MegatronConfig:
    """``--train-backend megatron``: the extra is installed and the parallel sizes fit the
    actor's GPUs — checked before anything starts."""
    from rl_core.backends.megatron import require_megatron
    from rl_core.backends.megatron.parallel import ParallelConfigError, check_parallel_sizes

    try:
        require_megatron()
    except ImportError as err:
        raise ConfigError(f"--train-backend megatron: {err}") from err
    parallel = megatron_config_from(ns)
    try:
        check_parallel_sizes(len(plan.roles["actor"].bundles), parallel)
    except ParallelConfigError as err:
        raise ConfigError(str(err)) from err
    return parallel
