"""``rl-core eval``: a model on an evaluation set, measured exactly as a training run measures it.

It takes the train command's flags (``--preset``, ``--config``, the judge, reward and placement
flags; a training command line works with ``train`` changed to ``eval``), starts the plan's
rollout engines and judge service as training does (``rl_core.services``, without the trainer),
and runs the same :meth:`~rl_core.evaluation.Evaluation.run` the training loop calls, through the
same generate-and-score (``rl_core.scoring``) and reward path (``rl_core.rewards.reward_setup``).
So the same weights, evaluation set, flags and greedy decoding give the figure the run logged:
``eval/accuracy`` (pass@1) and ``eval/reward_mean``. It adds unbiased pass@k for
``--n-samples-per-eval-prompt`` > 1, writes ``OUT/samples.jsonl`` (the training sample files'
fields) and ``OUT/summary.json``, and prints a table. The evaluation's seeds are those of the
run's evaluation before its first step (step 0). ``--from-run RUN_DIR`` takes every setting from
a run's recorded ``config.json`` instead of flags, with a new ``--hf-checkpoint``.

Bad input (a model that is not a model folder, a bad data file, an unknown reward, a bad
``--n-samples-per-eval-prompt``, an ``--out`` that holds files) is refused before Ray starts or a
model loads: one line, exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import logging
import shutil
import sys
import tempfile
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rl_core.config import ConfigError, TrainConfig, add_train_args, parse_train_args

__all__ = [
    "DEFAULT_OUT",
    "EvalRequest",
    "check_model_input",
    "check_out",
    "is_checkpoint",
    "model_input",
    "parse_eval_args",
    "run_eval",
]

logger = logging.getLogger(__name__)

#: where ``rl-core eval`` writes without ``--out``
DEFAULT_OUT = "evals/latest"
SAMPLES_FILE = "samples.jsonl"
SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class EvalRequest:
    """A validated ``rl-core eval`` command: the config (the train flags) and where to write."""

    cfg: TrainConfig
    out: Path
    force: bool = False


# --- the command line ----------------------------------------------------------------------------


#: what ``--from-run`` lets the command line change: the model and the evaluation's sampling
#: (everything else is the run's, so the figure is comparable with the run's own)
FROM_RUN_OVERRIDES: dict[str, type] = {
    "hf_checkpoint": str,
    "eval_prompt_data": str,
    "n_samples_per_eval_prompt": int,
    "eval_temperature": float,
    "eval_max_response_len": int,
    "eval_limit": int,
}


def _add_output_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("evaluation output")
    g.add_argument(
        "--from-run",
        default=None,
        metavar="RUN_DIR",
        help="take every setting from a training run's RUN_DIR/config.json (its eval set, "
        "reward, judges, placement and --eval-* flags); only "
        + ", ".join("--" + k.replace("_", "-") for k in FROM_RUN_OVERRIDES)
        + " may be given beside it",
    )
    g.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"folder for {SAMPLES_FILE} and {SUMMARY_FILE} (default: {DEFAULT_OUT})",
    )
    g.add_argument(
        "--force", action="store_true", help="write into --out even if it holds files already"
    )


def parse_eval_args(argv: Sequence[str]) -> EvalRequest:
    """The train flags (through :func:`~rl_core.config.parse_train_args`: presets, config files,
    every check) plus ``--out`` / ``--force``. ``--prompt-data`` is not needed: without it, the
    training set is the evaluation set (it is never read)."""
    own = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _add_output_args(own)
    mine, rest = own.parse_known_args(list(argv))
    out = Path(mine.out).expanduser()
    if mine.from_run is not None:
        return EvalRequest(cfg=config_from_run(mine.from_run, rest), out=out, force=mine.force)
    given = {a.split("=", 1)[0] for a in rest if a.startswith("--")}
    if "--prompt-data" not in given and "--eval-prompt-data" in given:
        i = next(i for i, a in enumerate(rest) if a.split("=", 1)[0] == "--eval-prompt-data")
        value = rest[i].split("=", 1)[1] if "=" in rest[i] else rest[i + 1]
        rest = [*rest, "--prompt-data", value]
    try:
        cfg = parse_train_args(rest)
    except ConfigError as err:
        if str(err).startswith("--prompt-data is required"):
            raise ConfigError(
                "--eval-prompt-data is required: a jsonl file or a gen: set to evaluate on"
            ) from None
        raise
    if cfg.eval_prompt_data is None:
        raise ConfigError(
            "--eval-prompt-data is required: a jsonl file or a gen: set to evaluate on"
        )
    return EvalRequest(cfg=cfg, out=out, force=mine.force)


def config_from_run(run_dir: str, argv: Sequence[str]) -> TrainConfig:
    """The config a training run recorded (``RUN_DIR/config.json``), with the model and the
    evaluation's sampling flags of ``argv`` applied (:data:`FROM_RUN_OVERRIDES`); any other flag
    is refused. Relative paths in it are the run's: call from the folder the run was started in."""
    from pydantic import ValidationError

    path = Path(run_dir).expanduser() / "config.json"
    p = argparse.ArgumentParser(prog="rl-core eval --from-run", add_help=False)
    for name, kind in FROM_RUN_OVERRIDES.items():
        p.add_argument(
            "--" + name.replace("_", "-"), dest=name, type=kind, default=argparse.SUPPRESS
        )
    known, other = p.parse_known_args(list(argv))
    if other:
        raise ConfigError(
            f"--from-run {run_dir}: {other[0]} cannot be changed (the run's config decides it); "
            "beside --from-run give only "
            + ", ".join("--" + k.replace("_", "-") for k in FROM_RUN_OVERRIDES)
        )
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"--from-run {run_dir}: no config.json there (not a run directory)"
        ) from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"--from-run {run_dir}: {path} cannot be read: {err}") from None
    try:
        cfg = TrainConfig.model_validate({**recorded, **vars(known)})
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise ConfigError(
            f"--from-run {run_dir}: --{loc.replace('_', '-')} = {first.get('input')!r}: "
            f"{first['msg'].removeprefix('Value error, ')}"
        ) from None
    if cfg.eval_prompt_data is None:
        raise ConfigError(
            f"--from-run {run_dir}: the run had no --eval-prompt-data; give one to evaluate on"
        )
    return cfg


# --- checks before anything starts ---------------------------------------------------------------


def is_checkpoint(spec: str) -> bool:
    """Whether ``spec`` is a training checkpoint (a ``--save`` folder or one of its steps)."""
    from rl_core.checkpoints import LATEST, STATE_FILE

    path = Path(spec).expanduser()
    return path.is_dir() and ((path / LATEST).is_file() or (path / STATE_FILE).is_file())


def check_model_input(spec: str) -> str:
    """``--hf-checkpoint`` names a model this command can evaluate: a transformers model folder,
    ``embedded[:name]``, or a training checkpoint of either backend, which is checked as
    ``rl-core export`` checks it (its base model recorded and present), no weight read.
    Returns the model folder the policy checks look at: for a checkpoint, its base model's."""
    from rl_core.export import ExportError, find_export_source

    if not is_checkpoint(spec):
        return spec
    try:
        return str(find_export_source(spec).base_dir)
    except ExportError as err:
        raise ConfigError(f"--hf-checkpoint {spec}: {err}") from None


def model_input(spec: str) -> str:
    """The local model folder to evaluate for ``--hf-checkpoint`` (``embedded[:name]`` becomes
    genrm-serve's cached copy). The one place that turns what the user named into a folder the
    rollout engines load. A training checkpoint is exported first, in fp32 (the trainer's own
    weights, bit for bit), to a temporary folder removed when the command exits."""
    from rl_core.launch import resolve_model

    if is_checkpoint(spec):
        from rl_core.export import export_hf

        tmp = Path(tempfile.mkdtemp(prefix="rl-core-eval-"))
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        return str(export_hf(spec, tmp / "model", dtype="fp32"))
    return resolve_model(spec)


def check_out(out: Path, force: bool) -> None:
    """``--out`` is a folder that is absent or empty (or ``--force``) and can be written."""
    from rl_core.folders import folder_problem

    hint = "an earlier evaluation? choose another folder or pass --force to write into it"
    problem = folder_problem(
        "--out", out, must_be_empty=True, force=force, if_not_empty=hint, create=True
    )
    if problem:
        raise ConfigError(problem)


def preflight_eval(req: EvalRequest) -> None:
    """Every check of the eval command, before Ray starts: the model, the judges' models, the
    evaluation set, the reward function, the output folder."""
    from rl_core.preflight import check_data_file, check_models, check_rewards

    cfg = req.cfg
    policy = check_model_input(cfg.hf_checkpoint)
    check_models(cfg.model_copy(update={"hf_checkpoint": policy}))
    # only the evaluation set is read: it alone is checked, whatever --prompt-data names
    assert cfg.eval_prompt_data is not None
    check_data_file(cfg, "--eval-prompt-data", cfg.eval_prompt_data)
    check_rewards(cfg)
    check_out(req.out, req.force)


# --- the evaluation ------------------------------------------------------------------------------


async def run_eval(req: EvalRequest, console: Console | None = None) -> dict[str, Any]:
    """Start the plan's rollout engines and judges, evaluate, write the samples and the summary;
    returns the summary (what ``OUT/summary.json`` holds)."""
    from transformers import AutoTokenizer

    from genrm_serve import apply_ray_env_defaults
    from rl_core.evaluation import Evaluation, pass_at_k_metrics
    from rl_core.launch import load_data
    from rl_core.metrics import PhaseClock, PhaseTimes
    from rl_core.placement import render_plan
    from rl_core.rewards import reward_setup
    from rl_core.scoring import RolloutScorer, rollout_settings
    from rl_core.services import start_ray, start_services
    from rl_core.specs import resolve_rollout_engine, rollout_seeded

    cfg, out = req.cfg, req.out
    apply_ray_env_defaults(disable_auth=True)
    console = console or Console(stderr=True)
    clock = PhaseClock(console)
    startup: PhaseTimes = {}
    console.print(render_plan(cfg.plan))
    rollout_engine = resolve_rollout_engine(cfg)
    await asyncio.to_thread((out / "config.json").write_text, cfg.model_dump_json(indent=1))
    async with AsyncExitStack() as stack:
        with clock.timed("ray", startup):
            realized = await start_ray(cfg.plan, stack, None)
        with clock.timed("models", startup):
            policy_path = await asyncio.to_thread(model_input, cfg.hf_checkpoint)
        services = await start_services(
            cfg,
            realized,
            policy_path,
            rollout_engine,
            stack,
            console,
            clock,
            startup,
            trainer=False,
        )
        tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, policy_path)
        assert cfg.eval_prompt_data is not None
        data = load_data(cfg.eval_prompt_data, cfg, out, eval_set=True)
        evaluation = Evaluation(cfg, data)
        rewards = reward_setup(cfg, judge=services.judge)
        scorer = RolloutScorer(services.engines, tokenizer, rewards, services.phases, clock)
        settings = rollout_settings(cfg, seeded=rollout_seeded(cfg, rollout_engine))
        evaluated: PhaseTimes = {}
        with clock.timed("eval", evaluated):
            metrics = await evaluation.run(0, scorer.awake, settings)
    samples = evaluation.last_samples
    if cfg.n_samples_per_eval_prompt > 1:
        metrics.update(pass_at_k_metrics(samples, cfg.n_samples_per_eval_prompt))
    used = evaluation.settings(settings)
    summary = {
        "model": cfg.hf_checkpoint,
        "model_folder": policy_path,
        "eval_prompt_data": cfg.eval_prompt_data,
        "prompts": len({s.group_id for s in samples}),
        "n_samples_per_eval_prompt": cfg.n_samples_per_eval_prompt,
        "eval_temperature": used.temperature,
        "eval_max_response_len": used.max_response_len,
        "reward": cfg.custom_rm_path or cfg.rm_type,
        "reward_key": cfg.reward_key,
        "seconds": evaluated["eval"],
        "startup_s": startup,
        # the keys and values a training run logs in metrics.jsonl for its evaluations
        "metrics": metrics,
    }
    await asyncio.to_thread(_write_outputs, out, samples, summary)
    return summary


def _write_outputs(out: Path, samples: list[Any], summary: dict[str, Any]) -> None:
    from rl_core.trainer import sample_row

    with (out / SAMPLES_FILE).open("w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps(sample_row(s), default=str) + "\n")
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=1, default=str) + "\n")


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def render_eval_summary(summary: dict[str, Any], out: Path) -> Table:
    """The short table the command prints: what was measured, on what."""
    m = summary["metrics"]
    table = Table(title=f"rl-core eval: {summary['model']}", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value")
    n = summary["n_samples_per_eval_prompt"]
    rows: list[tuple[str, Any]] = [
        ("data", summary["eval_prompt_data"]),
        ("prompts × samples", f"{summary['prompts']} × {n} = {m['eval/samples']}"),
        (
            "sampling",
            f"temperature {summary['eval_temperature']:g}, "
            f"≤ {summary['eval_max_response_len']} tokens",
        ),
        ("pass@1 (eval/accuracy)", m["eval/accuracy"]),
    ]
    rows += [
        (k.removeprefix("eval/"), f"{_fmt(v)} over {m[k + '_prompts']} prompts")
        for k, v in m.items()
        if k.startswith("eval/pass@") and not k.endswith(("_prompts", "@1"))
    ]
    agreement = m.get("eval/judge_rule_agreement")
    rows += [
        ("reward mean (eval/reward_mean)", m["eval/reward_mean"]),
        ("judge errors (left out)", m["eval/judge_errors"]),
        (
            "judge agrees with math-verify",
            f"{_fmt(agreement)} on {m.get('eval/judge_rule_compared', 0)} compared",
        ),
        ("response length (mean tokens)", m["eval/response_len_mean"]),
        ("written", f"{out / SAMPLES_FILE}, {out / SUMMARY_FILE}"),
    ]
    for name, value in rows:
        table.add_row(name, _fmt(value))
    return table


def _one_line(message: str) -> str:
    """A config error with one invalid value, without the heading above it."""
    lines = message.splitlines()
    return lines[1].strip() if len(lines) == 2 and lines[0].endswith(":") else message


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 done, 2 a bad input (refused before Ray starts), 1 a failure."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("rl_core").setLevel(logging.INFO)
    try:
        req = parse_eval_args(sys.argv[1:] if argv is None else argv)
        preflight_eval(req)
    except ConfigError as err:
        print(f"rl-core eval: {_one_line(str(err))}", file=sys.stderr)
        return 2
    from genrm_serve import EngineStartError
    from rl_core.placement import PlacementError, PlacementUnavailableError
    from rl_core.train import _run

    try:
        summary = _run(run_eval(req))
    except (PlacementError, PlacementUnavailableError) as err:
        print(f"rl-core eval: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rl-core eval: stopped by SIGINT; nothing written", file=sys.stderr)
        return 130
    except EngineStartError as err:
        print(f"rl-core eval: {err}", file=sys.stderr)
        return 1
    Console().print(render_eval_summary(summary, req.out))
    return 0


# --- the ``rl-core eval`` subcommand -------------------------------------------------------------

#: :func:`main` parses the command line again (presets and ``--config`` change the defaults
#: first, and the original's ``--sglang-KEY VALUE`` flags are taken there).
ACCEPTS_UNKNOWN_FLAGS = True


def configure(parser: argparse.ArgumentParser) -> None:
    """Every train flag (for ``--help``) and the output flags."""
    parser.description = (
        "Evaluate a model folder on an evaluation set with the training run's engines, judges, "
        "reward and placement; reports pass@1, pass@k, mean reward, judge errors and the "
        "judge's agreement with math-verify."
    )
    add_train_args(parser)
    _add_output_args(parser)


def run(args: argparse.Namespace) -> int:
    return main(list(args.subcommand_argv))


if __name__ == "__main__":
    raise SystemExit(main())
