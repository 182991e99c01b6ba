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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from genrm_serve.config import GenRMConfigError, InstanceSpec, instances_from_args
from rl_core.placement.args import add_placement_args

#: The embedded Gemma 3 270M (genrm-serve's cached safetensors copy), for policy or judge.
EMBEDDED_MODEL = "embedded:gemma3-270m"
#: ``--prompt-data`` values that generate the CPU demo's arithmetic set instead of reading a file.
GENERATED_DATA = ("gen:easy-math", "gen:easy-math-eval")


class ConfigError(ValueError):
    """An invalid training configuration; the message names the flag, the value and the rule."""


class TrainConfig(BaseModel):
    """Everything ``rl-core train`` needs, validated."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # policy and backend
    hf_checkpoint: str
    train_backend: Literal["torch"] = "torch"
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
    # rewards
    rm_type: str | None = None
    reward_key: str = "score"
    custom_rm_path: str | None = None
    defer_reward_to_post_process: bool = False
    custom_reward_post_process_path: str | None = None
    reward_concurrency: int = Field(default=32, gt=0)
    max_judge_error_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    rule_gate: bool = False
    deferred_rm_type: str = "dapo-genrm"
    # judges (genrm-serve's parser) and placement
    genrm_instances: dict[str, InstanceSpec] = Field(default_factory=dict)
    resource: dict[str, list[int]] | None = None
    colocate: bool = False
    fully_async: bool = False
    rollout_num_gpus: int | None = None
    rollout_num_gpus_per_engine: int = 1
    sglang_mem_fraction_static: float | None = None
    num_gpus_per_node: int = 8
    builtin_reward_post_process: bool = False
    # checkpoints and output
    save: str | None = None
    save_interval: int | None = Field(default=None, gt=0)
    load: str | None = None
    run_dir: str = "runs/latest"
    preset: str | None = None

    @property
    def train_batch_size(self) -> int:
        """Samples per optimizer step (``--global-batch-size``, default: the whole rollout)."""
        return self.global_batch_size or self.rollout_batch_size * self.n_samples_per_prompt

    @property
    def genrm_enabled(self) -> bool:
        return bool(self.genrm_instances)

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
        if self.use_kl_loss and self.kl_loss_coef == 0.0:
            pass  # allowed: KL is logged only, and no reference model is loaded
        if self.defer_reward_to_post_process and self.rm_type not in (None, "dummy"):
            raise ValueError(
                f"--defer-reward-to-post-process needs --rm-type dummy (got {self.rm_type!r}): "
                "the inline reward is a placeholder, the batch is scored after rollout"
            )
        if self.rm_type is None and self.custom_rm_path is None:
            raise ValueError("set --rm-type (e.g. dapo-genrm, math, dummy) or --custom-rm-path")
        if self.rm_type == "dummy" and not self.defer_reward_to_post_process:
            raise ValueError(
                "--rm-type dummy gives every sample a deferred placeholder; it needs "
                "--defer-reward-to-post-process (otherwise nothing would ever score the batch)"
            )
        if self.save_interval is not None and self.save is None:
            raise ValueError(f"--save-interval {self.save_interval} needs --save DIR")
        if self.colocate and self.fully_async:
            raise ValueError("--colocate and --fully-async exclude each other")
        if self.lr_decay_style != "constant" and self.lr_decay_iters is None:
            raise ValueError(f"--lr-decay-style {self.lr_decay_style} needs --lr-decay-iters")
        return self


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
        "eval_max_response_len": 4,
        "eval_temperature": 0.0,
        "rm_type": "dapo-genrm",
        "rule_gate": True,
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


# --- argparse ------------------------------------------------------------------------------------


def _bool_flag(g: argparse._ArgumentGroup, name: str, help: str, default: bool = False) -> None:
    g.add_argument(name, action=argparse.BooleanOptionalAction, default=default, help=help)


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
    g.add_argument("--hf-checkpoint", default=None, help=f"policy model (or {EMBEDDED_MODEL})")
    g.add_argument("--train-backend", default="torch", choices=["torch"])
    g.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    _bool_flag(g, "--bf16", "bf16 autocast (a CPU without native bf16 uses fp32 and warns)")
    g.add_argument("--max-tokens-per-gpu", type=int, default=4096, help="micro-batch token budget")
    g.add_argument("--logprob-chunk-size", type=int, default=256)

    g = p.add_argument_group("GRPO")
    g.add_argument("--advantage-estimator", default="grpo", choices=["grpo"])
    g.add_argument(
        "--disable-grpo-std-normalization",
        dest="grpo_std_normalization",
        action="store_false",
        help="only subtract the group mean",
    )
    _bool_flag(g, "--use-kl-loss", "add a KL term to a frozen reference")
    g.add_argument("--kl-loss-coef", type=float, default=0.0)
    g.add_argument("--kl-loss-type", default="low_var_kl", choices=["low_var_kl", "k1", "k2"])
    g.add_argument("--eps-clip", type=float, default=0.2)
    g.add_argument("--eps-clip-high", type=float, default=None)
    _bool_flag(g, "--use-tis", "truncated importance sampling with rollout log-probs")
    g.add_argument("--tis-clip", type=float, default=2.0)
    g.add_argument("--tis-clip-low", type=float, default=0.0)

    g = p.add_argument_group("optimizer")
    g.add_argument("--optimizer", default="adam", choices=["adam"])
    g.add_argument("--lr", type=float, default=1e-6)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--lr-decay-style", default="constant", choices=["constant", "linear", "cosine"])
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-decay-iters", type=int, default=None)
    g.add_argument("--weight-decay", type=float, default=0.0)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.98)
    g.add_argument("--clip-grad", type=float, default=1.0)

    g = p.add_argument_group("rollout")
    g.add_argument("--num-rollout", "--num-steps", dest="num_rollout", type=int, default=1)
    g.add_argument("--rollout-batch-size", type=int, default=8, help="prompts per step")
    g.add_argument("--n-samples-per-prompt", type=int, default=8)
    g.add_argument("--global-batch-size", type=int, default=None, help="samples per optim step")
    g.add_argument("--rollout-max-response-len", type=int, default=1024)
    g.add_argument("--rollout-max-prompt-len", type=int, default=None)
    g.add_argument("--rollout-temperature", type=float, default=1.0)
    g.add_argument("--rollout-top-p", type=float, default=1.0)
    g.add_argument("--rollout-top-k", type=int, default=-1)
    g.add_argument("--rollout-stop", nargs="*", default=None)
    _bool_flag(g, "--rollout-shuffle", "shuffle prompts each epoch", default=True)
    g.add_argument("--seed", type=int, default=1234)

    g = p.add_argument_group("data")
    g.add_argument("--prompt-data", default=None, help=f"jsonl, or one of {GENERATED_DATA}")
    g.add_argument("--eval-prompt-data", default=None, help="AIME-format jsonl")
    g.add_argument("--input-key", default="prompt")
    g.add_argument("--label-key", default="label")
    _bool_flag(g, "--apply-chat-template", "render chat prompts with the tokenizer's template")
    _bool_flag(g, "--strict-data", "a bad record is fatal instead of skipped")
    g.add_argument("--n-samples-per-eval-prompt", type=int, default=1)
    g.add_argument("--eval-max-response-len", type=int, default=None)
    g.add_argument("--eval-temperature", type=float, default=None)
    g.add_argument("--eval-interval", type=int, default=None)
    g.add_argument("--eval-limit", type=int, default=None, help="evaluate on the first N only")

    g = p.add_argument_group("rewards")
    g.add_argument("--reward-key", default="score")
    g.add_argument("--custom-rm-path", default=None, help="module.func")
    g.add_argument("--reward-concurrency", type=int, default=32)
    g.add_argument(
        "--max-judge-error-fraction",
        type=float,
        default=0.5,
        help="stop the run when a larger share of a step's samples has no reward",
    )
    _bool_flag(g, "--rule-gate", "math-verify proves a match → 1 without calling the judge")
    g.add_argument("--deferred-rm-type", default="dapo-genrm", help="reward of the deferred batch")

    # --resource, --colocate / --fully-async, rollout GPU flags, --rm-type and the defer flags,
    # and genrm-serve's --genrm-* flags: one definition, shared with `rl-core plan`.
    add_placement_args(p)

    g = p.add_argument_group("checkpoints and output")
    g.add_argument("--save", default=None)
    g.add_argument("--save-interval", type=int, default=None)
    g.add_argument("--load", default=None)
    g.add_argument("--run-dir", default="runs/latest", help="metrics, TensorBoard, plots")


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
        if dest.startswith("genrm_") and isinstance(value, dict):
            value = json.dumps(value)
        out[dest] = value
    return out


def parse_train_args(argv: Sequence[str] | None = None) -> tuple[TrainConfig, argparse.Namespace]:
    """Parse flags (+ preset + config file) into a validated ``TrainConfig``.

    Returns the config and the raw namespace (reward functions receive the latter as ``args``,
    so options they define, e.g. the rule gate, reach them).
    """
    parser = build_parser()
    first, _ = parser.parse_known_args(argv)
    defaults: dict[str, Any] = {}
    if first.preset:
        defaults.update(PRESETS[first.preset])
    if first.config:
        defaults.update(_file_values(first.config, parser))
    parser.set_defaults(**defaults)
    ns = parser.parse_args(argv)
    cfg = config_from_namespace(ns)
    if cfg.resource is not None:  # a wrong layout is caught here, before any model loads
        from rl_core.placement import PlacementError, plan_from_args

        try:
            plan_from_args(ns)
        except PlacementError as err:
            raise ConfigError(str(err)) from err
    return cfg, ns


def config_from_namespace(ns: argparse.Namespace) -> TrainConfig:
    values = dict(vars(ns))
    values.pop("config", None)
    for flag in ("hf_checkpoint", "prompt_data"):
        if values.get(flag) is None:
            raise ConfigError(f"--{flag.replace('_', '-')} is required (or use --preset cpu-demo)")
    try:
        values["genrm_instances"] = _instances(ns) if _genrm_given(ns) else {}
    except GenRMConfigError as err:
        raise ConfigError(str(err)) from err
    for key in list(values):
        if key.startswith("genrm_") and key != "genrm_instances":
            values.pop(key)
    if isinstance(values.get("resource"), str):
        try:
            values["resource"] = json.loads(values["resource"])
        except json.JSONDecodeError as err:
            raise ConfigError(f"--resource: invalid JSON at position {err.pos}: {err.msg}") from err
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


def _instances(ns: argparse.Namespace) -> dict[str, InstanceSpec]:
    num_gpus = ns.genrm_num_gpus
    if num_gpus is None:  # placement's default: the genrm entry of --resource, else 1
        try:
            resource = json.loads(ns.resource) if isinstance(ns.resource, str) else ns.resource
        except json.JSONDecodeError:
            resource = None  # reported below, with the position, as a --resource error
        genrm = (resource or {}).get("genrm") if isinstance(resource, dict) else None
        num_gpus = genrm[0] * genrm[1] if isinstance(genrm, list) and len(genrm) == 2 else 1
        num_gpus = num_gpus if isinstance(num_gpus, int) and num_gpus > 0 else 1
    return instances_from_args(ns, num_gpus=num_gpus)


def _genrm_given(ns: argparse.Namespace) -> bool:
    return bool(ns.genrm_model_path or ns.genrm_instances)
