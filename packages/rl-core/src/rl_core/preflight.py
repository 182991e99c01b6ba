"""Checks of a ``rl-core train`` config that read files: run before Ray starts.

``TrainConfig`` checks values against each other; these look at what the values point to — data
files, reward functions and hooks, model folders, a checkpoint to resume, the ``--save`` folder.
Each of them used to fail only after Ray, the engines, the judge service and the trainer had
loaded (minutes with real models), with a traceback; here each is a :class:`ConfigError` that
names the flag, the value and the rule, in about a second, and a run that cannot start never
starts a model.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rl_core.checkpoints import (
    CHECKPOINT_BYTES_PER_PARAM,
    LATEST,
    STATE_FILE,
    checkpoint_path,
    estimate_checkpoint_bytes,
    read_checkpoint_state,
)
from rl_core.config import ConfigError, TrainConfig
from rl_core.data import DataError, load_prompt_data, parse_record, record_json
from rl_core.folders import folder_problem
from rl_core.generated import GENERATED_SETS
from rl_core.judge_checks import check_judge_settings

__all__ = [
    "check_data",
    "check_data_file",
    "check_group_judging",
    "check_load",
    "check_models",
    "check_rewards",
    "check_run_dir",
    "check_save",
    "check_save_hf",
    "preflight",
]


def preflight(cfg: TrainConfig) -> None:
    """Every check below, in the order a user would fix them; the first failure is raised."""
    check_models(cfg)
    check_data(cfg)
    check_rewards(cfg)
    check_judge_settings(cfg)  # rubrics in the data, judge panels
    check_group_judging(cfg)
    check_load(cfg)
    check_save(cfg)
    check_run_dir(cfg)
    check_save_hf(cfg)


# --- models ----------------------------------------------------------------------------------


def _check_model_folder(flag: str, path: str) -> None:
    from genrm_serve import check_model_path

    try:
        check_model_path(path)
    except FileNotFoundError as err:
        raise ConfigError(f"{flag} {path}: {err}") from None


def check_models(cfg: TrainConfig) -> None:
    """The policy and every judge that loads a model are folders with a config; a judge's
    adapter and engine Python are what they must be (genrm-serve's own check, which
    ``genrm-serve run`` runs too), named by the flags that set them."""
    from genrm_serve import InstanceFileError, check_instance_files

    _check_model_folder("--hf-checkpoint", cfg.hf_checkpoint)
    try:
        check_instance_files(cfg.genrm_instances)
    except InstanceFileError as err:
        if err.key != "__default__":
            where = f"--genrm-instances {err.key}"
            if err.setting != "model_path":
                where += f" {err.setting}"
        elif err.setting == "model_path":
            where = "--genrm-model-path"
        else:
            where = f"--genrm-engine-config {err.setting.removeprefix('engine_config.')}"
        raise ConfigError(f"{where} {err.value}: {err.reason}") from None


# --- data ------------------------------------------------------------------------------------


def check_data(cfg: TrainConfig) -> None:
    """Each data file is read up to its first usable record (all of it under ``--strict-data``,
    where any bad record is fatal), with ``--input-key`` / ``--label-key`` checked on it."""
    for flag, spec in (
        ("--prompt-data", cfg.prompt_data),
        ("--eval-prompt-data", cfg.eval_prompt_data),
    ):
        if spec is not None:
            check_data_file(cfg, flag, spec)


def check_data_file(cfg: TrainConfig, flag: str, spec: str) -> None:
    """One data file (or ``gen:`` set) of ``flag``, as :func:`check_data` checks each."""
    if spec in GENERATED_SETS:  # written at start-up, with the records' own keys
        sample = GENERATED_SETS[spec]()[0]
        try:
            parse_record(record_json(sample), input_key=cfg.input_key, label_key=cfg.label_key)
        except DataError as err:
            raise ConfigError(f"{flag} {spec}: the generated records do not fit: {err}") from None
        return
    try:
        load_prompt_data(
            spec,
            input_key=cfg.input_key,
            label_key=cfg.label_key,
            strict=cfg.strict_data,
            limit=None if cfg.strict_data else 1,
        )
    except DataError as err:
        raise ConfigError(f"{flag} {spec}: {err}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{flag} {spec}: cannot be read: {err}") from None


# --- rewards ---------------------------------------------------------------------------------


def check_rewards(cfg: TrainConfig) -> None:
    """The reward function (``--rm-type`` or ``--custom-rm-path``) and the post-process hook
    are imported and their signatures checked, as the run would load them."""
    from genrm_rewards.errors import RewardConfigError
    from genrm_rewards.registry import get_reward_fn, load_custom

    try:
        if cfg.custom_rm_path:
            load_custom(cfg.custom_rm_path, setting="--custom-rm-path")
        elif cfg.rm_type:
            try:
                get_reward_fn(cfg.rm_type)
            except RewardConfigError as err:
                raise RewardConfigError(
                    f"--rm-type {cfg.rm_type}: {str(err).removeprefix('unknown reward type ')}"
                ) from None
        if cfg.custom_reward_post_process_path:
            load_custom(
                cfg.custom_reward_post_process_path, setting="--custom-reward-post-process-path"
            )
    except RewardConfigError as err:
        raise ConfigError(str(err)) from None


def _pairwise_reward(cfg: TrainConfig) -> str | None:
    """The flag that makes ``pairwise-genrm`` the run's reward, if one does."""
    if cfg.custom_rm_path:
        return None
    if cfg.defer_reward_to_post_process and cfg.deferred_rm_type == "pairwise-genrm":
        return "--deferred-rm-type"
    if not cfg.defer_reward_to_post_process and cfg.rm_type == "pairwise-genrm":
        return "--rm-type"
    return None


def check_group_judging(cfg: TrainConfig) -> None:
    """``pairwise-genrm``'s pairing fits the groups it will rank, and
    ``--group-judge-deadline-s`` applies where it is set.

    A round robin of n responses has n-1 rounds (n for an odd n); more would repeat pairs. A
    ``--pairwise-min-comparisons`` above what the pairing asks every response in would make a
    response a judge error on every step; a group of one has nothing to compare. A custom
    post-process hook scores on its own, so a deadline there would be silently ignored.
    """
    from genrm_rewards.pairwise import guaranteed_comparisons, max_rounds

    if cfg.group_judge_deadline_s is not None and cfg.custom_reward_post_process_path:
        raise ConfigError(
            f"--group-judge-deadline-s {cfg.group_judge_deadline_s:g}: the deadline applies to "
            "rl-core's own scoring, and --custom-reward-post-process-path "
            f"{cfg.custom_reward_post_process_path} scores the batch itself; drop one"
        )
    via = _pairwise_reward(cfg)
    if via is None:
        return
    sizes = [("--n-samples-per-prompt", cfg.n_samples_per_prompt)]
    if cfg.eval_prompt_data is not None:
        sizes.append(("--n-samples-per-eval-prompt", cfg.n_samples_per_eval_prompt))
    for flag, n in sizes:
        if n < 2:
            raise ConfigError(
                f"{flag} {n}: {via} pairwise-genrm compares the responses of a group, and a "
                "group of 1 has none to compare with (every sample would be a judge error); "
                "use at least 2"
            )
    n = cfg.n_samples_per_prompt
    if cfg.pairwise_pairing == "round-robin" and cfg.pairwise_rounds > max_rounds(n):
        raise ConfigError(
            f"--pairwise-rounds {cfg.pairwise_rounds}: a round robin of --n-samples-per-prompt "
            f"{n} has {max_rounds(n)} rounds; use at most {max_rounds(n)}, or "
            "--pairwise-pairing all"
        )
    for flag, size in sizes:
        asked = guaranteed_comparisons(
            size, cfg.pairwise_pairing, cfg.pairwise_rounds, cfg.pairwise_both_orders
        )
        if cfg.pairwise_min_comparisons > asked:
            raise ConfigError(
                f"--pairwise-min-comparisons {cfg.pairwise_min_comparisons}: with "
                f"--pairwise-pairing {cfg.pairwise_pairing}"
                + (
                    f" --pairwise-rounds {cfg.pairwise_rounds}"
                    if cfg.pairwise_pairing != "all"
                    else ""
                )
                + f"{'' if cfg.pairwise_both_orders else ' --no-pairwise-both-orders'} and "
                f"{flag} {size}, some response is asked in only {asked} comparison(s), so it "
                "would be a judge error every step; lower it or compare more pairs"
            )


# --- checkpoints -----------------------------------------------------------------------------


def check_load(cfg: TrainConfig) -> None:
    """``--load`` is a checkpoint (its metadata read, not its weights) that this run can
    continue: the same ``--seed``, a step below ``--num-rollout``."""
    if cfg.load is None:
        return
    root = Path(cfg.load).expanduser()
    if not root.is_dir():
        raise ConfigError(f"--load {cfg.load}: no such folder")
    path = checkpoint_path(root)
    if not (path / STATE_FILE).is_file():
        raise ConfigError(
            f"--load {cfg.load}: not a checkpoint (no {LATEST} file naming one, and no "
            f"{STATE_FILE} in {path}); give a --save folder or one of its step_* folders"
        )
    try:
        extra = read_checkpoint_state(path)["extra"]
        step = int(extra["rollout_step"])
        cursor = extra["cursor"]
        seed = int(cursor["seed"])
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"--load {cfg.load}: unreadable {path / STATE_FILE}: {err}") from None
    if seed != cfg.seed:
        raise ConfigError(
            f"--seed {cfg.seed}: the checkpoint {path} was trained with --seed {seed}; a resumed "
            "run must keep it (the data order depends on it): pass --seed "
            f"{seed}"
        )
    if step >= cfg.num_rollout:
        raise ConfigError(
            f"--num-rollout {cfg.num_rollout}: the checkpoint {path} is at step {step} already; "
            "raise --num-rollout to train further"
        )


# --- the --run-dir folder ---------------------------------------------------------------------


def check_run_dir(cfg: TrainConfig) -> None:
    """A fresh run (no ``--load``) does not add its records to another run's: a ``--run-dir``
    whose ``metrics.jsonl`` holds steps is refused unless ``--overwrite-run-dir`` says to
    replace them (a resume cuts what was logged beyond its checkpoint, and goes on there)."""
    from rl_core.metrics import METRICS_FILE, logged_steps

    if cfg.load is not None or cfg.overwrite_run_dir:
        return
    steps = logged_steps(cfg.run_dir)
    if not steps:
        return
    raise ConfigError(
        f"--run-dir {cfg.run_dir}: holds another run's metrics ({len(steps)} record(s), steps "
        f"{min(steps)}-{max(steps)} in {METRICS_FILE}); a fresh run would log its steps after "
        "them. Pass --overwrite-run-dir to replace them, choose a new --run-dir, or --load that "
        "run's checkpoint to resume it"
    )


# --- the --save folder -----------------------------------------------------------------------


def _policy_folder(cfg: TrainConfig) -> Path | None:
    from genrm_serve import default_cache_dir, is_embedded

    if is_embedded(cfg.hf_checkpoint):
        name = cfg.hf_checkpoint.partition(":")[2] or "gemma3-270m"
        folder = default_cache_dir() / name
        return folder if folder.is_dir() else None  # converted on first use: size unknown yet
    return Path(cfg.hf_checkpoint).expanduser()


def check_save(cfg: TrainConfig) -> None:
    """``--save`` can be written (a file is created and removed there) and has room for one
    checkpoint, by an estimate from the policy's size."""
    if cfg.save is None:
        return
    problem = folder_problem("--save", cfg.save, must_be_empty=False, create=True)
    if problem:
        raise ConfigError(f"{problem}; checkpoints could not be written there")
    root = Path(cfg.save).expanduser()
    folder = _policy_folder(cfg)
    needed = estimate_checkpoint_bytes(folder) if folder is not None else None
    if needed is None:
        return
    free = shutil.disk_usage(root).free
    if free < needed:
        raise ConfigError(
            f"--save {cfg.save}: {free / 1e9:.2f} GB free, one checkpoint needs about "
            f"{needed / 1e9:.2f} GB (the policy's parameters x {CHECKPOINT_BYTES_PER_PARAM} bytes: "
            "weights and Adam state in fp32); free space or choose another folder"
        )


def check_save_hf(cfg: TrainConfig) -> None:
    """``--save-hf`` can become the model folder at the end: new or empty, its parent writable
    (found now, not after the whole run)."""
    if cfg.save_hf is None:
        return
    from rl_core.export import ExportError, check_out_dir

    out = Path(cfg.save_hf).expanduser().resolve()
    if cfg.save is not None:
        save = Path(cfg.save).expanduser().resolve()
        if out == save or out.is_relative_to(save) or save.is_relative_to(out):
            raise ConfigError(
                f"--save-hf {cfg.save_hf}: is, holds or lies in --save {cfg.save}; the model "
                "folder needs a folder of its own"
            )
    try:
        check_out_dir("--save-hf", out)
    except ExportError as err:
        raise ConfigError(str(err)) from None
