"""Preflight checks of the judge rewards' own inputs: rubrics in the data, and judge panels.

``rubric-genrm`` reads a rubric from every record (``metadata["rubric"]``) or from the run's
``--rubric-path`` file; a record with neither, or with a malformed one, would fail its samples'
rewards mid-run, after every model has loaded. Here the whole of each data file is read once
and the first such record is refused, naming the file, the line (and the record's ``id``) and
the key. ``--judge-panel`` must name judge instances the run starts, for a reward that reads
it. Each failure is a :class:`ConfigError`, as the rest of ``rl_core.preflight``.
"""

from __future__ import annotations

import json
from pathlib import Path

from rl_core.config import ConfigError, TrainConfig
from rl_core.generated import GENERATED_SETS

__all__ = ["check_judge_settings", "check_panel", "check_rubrics", "scoring_reward"]

RUBRIC_REWARD = "rubric-genrm"


def scoring_reward(cfg: TrainConfig) -> str | None:
    """The built-in reward that scores the run's samples: ``--rm-type``, or in defer mode
    ``--deferred-rm-type``; ``None`` when a custom function or hook scores them."""
    if cfg.custom_rm_path:
        return None
    if cfg.defer_reward_to_post_process:
        return None if cfg.custom_reward_post_process_path else cfg.deferred_rm_type
    return cfg.rm_type


def check_judge_settings(cfg: TrainConfig) -> None:
    """Both checks below."""
    check_panel(cfg)
    check_rubrics(cfg)


def check_panel(cfg: TrainConfig) -> None:
    """``--judge-panel``: read by the reward that scores (dapo-genrm, rubric-genrm or a custom
    function), and every member is a judge instance of the run."""
    from genrm_rewards.panel import PANEL_REWARDS

    if not cfg.judge_panel:
        return
    panel = ",".join(cfg.judge_panel)
    name = scoring_reward(cfg)
    if name is not None and name not in PANEL_REWARDS:
        raise ConfigError(
            f"--judge-panel {panel}: the reward {name!r} does not ask a panel (the panel-aware "
            f"rewards: {', '.join(sorted(PANEL_REWARDS))}); drop the flag or change the reward"
        )
    if cfg.genrm_instances:
        missing = [m for m in cfg.judge_panel if m not in cfg.genrm_instances]
        if missing:
            raise ConfigError(
                f"--judge-panel {panel}: no judge instance {missing[0]!r} in this run (its "
                f"instances: {', '.join(sorted(cfg.genrm_instances))}); add it to "
                "--genrm-instances"
            )


def check_rubrics(cfg: TrainConfig) -> None:
    """With ``rubric-genrm``: ``--rubric-path`` is a valid rubric, and every record of the
    training and evaluation data has a valid rubric of its own or falls back on it."""
    if scoring_reward(cfg) != RUBRIC_REWARD:
        return
    from genrm_rewards.errors import RewardConfigError
    from genrm_rewards.rubric import load_rubric_file

    if cfg.rubric_path is not None:
        try:
            load_rubric_file(cfg.rubric_path)
        except RewardConfigError as err:
            raise ConfigError(f"--rubric-path {cfg.rubric_path}: {err}") from None
    for flag, spec in (
        ("--prompt-data", cfg.prompt_data),
        ("--eval-prompt-data", cfg.eval_prompt_data),
    ):
        if spec is not None:
            _check_file_rubrics(cfg, flag, spec)


def _check_file_rubrics(cfg: TrainConfig, flag: str, spec: str) -> None:
    from genrm_rewards.errors import RewardInputError
    from genrm_rewards.rubric import parse_rubric

    key = cfg.rubric_key
    if spec in GENERATED_SETS:
        if cfg.rubric_path is None:
            raise ConfigError(
                f"{flag} {spec}: its records have no metadata[{key!r}]; give the run's rubric "
                "with --rubric-path (rubric-genrm)"
            )
        return
    path = Path(spec)
    if not path.is_file():
        return  # the data check names it
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            try:
                record = json.loads(line) if line.strip() else None
            except json.JSONDecodeError:
                continue  # a bad line is the data check's (skipped, or fatal with --strict-data)
            if not isinstance(record, dict):
                continue
            metadata = record.get("metadata") or {}
            if not isinstance(metadata, dict):
                continue
            where = f"{flag} {spec}: line {lineno}"
            if "id" in metadata:
                where += f" (id {metadata['id']!r})"
            if key not in metadata:
                if cfg.rubric_path is None:
                    raise ConfigError(
                        f"{where}: no metadata[{key!r}] and no --rubric-path; rubric-genrm "
                        "needs a rubric for every record"
                    )
                continue
            try:
                parse_rubric(metadata[key], where=f"metadata[{key!r}]")
            except RewardInputError as err:
                raise ConfigError(f"{where}: {err}") from None
