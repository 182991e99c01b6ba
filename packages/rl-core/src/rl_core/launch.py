"""From a config to a running GRPO job: the plan realised on Ray, then the loop.

:func:`run_training` reads like the set-up of the algorithm: placement groups from the plan →
rollout engines, as many and as large as the plan's, each in its bundles → judge engines per
instance in theirs, handed to the judge service (which then creates no placement group of its
own) → the trainer group (one Ray actor per actor GPU, one ``torch.distributed`` group) → the
GRPO loop. What the engines start as is ``rl_core.specs``; starting and stopping them is
``rl_core.services``. The same path runs on a GPU cluster and on a CPU machine (bundles of CPUs,
or Ray's logical GPUs with ``--device cpu``).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from transformers import AutoTokenizer

from genrm_serve import RemoteEngine, apply_ray_env_defaults, resolve_model_path
from rl_core.checkpoints import Checkpointer
from rl_core.config import TrainConfig
from rl_core.data import PromptDataset, load_prompt_data, write_prompt_data
from rl_core.engine_recovery import RecoverableEngine, node_lost
from rl_core.evaluation import Evaluation
from rl_core.generated import GENERATED_SETS
from rl_core.layout import read_layout, write_layout
from rl_core.limits import FAILED_STEP_PROBE_S, PLACEMENT_TIMEOUT_S
from rl_core.lost import ProcessLostError, find_lost_actor, lost_actor_error, lost_trainer_rank
from rl_core.metrics import (
    GpuMemoryProbe,
    MetricsWriter,
    PhaseClock,
    PhaseTimes,
    clear_run_records,
    read_metrics,
)
from rl_core.placement import PlacementUnavailableError, render_plan
from rl_core.restarts import Restart, RunLostError, decide_restart, restarted_config
from rl_core.rewards import reward_setup
from rl_core.services import (
    JudgeService,
    Services,
    connect_ray,
    place,
    shutdown_engines,
    start_services,
    start_weight_sync,
)
from rl_core.specs import resolve_rollout_engine, rollout_seeded
from rl_core.stopping import StopRequest
from rl_core.terminal import make_console
from rl_core.trainer import GRPOTrainer, StepRecord
from rl_core.wandb_mirror import WandbMirror

logger = logging.getLogger(__name__)


def resolve_model(path: str) -> str:
    """A local model folder: ``embedded[:name]`` becomes genrm-serve's cached safetensors copy
    of the embedded model (converted from GGUF once), anything else must be a model folder."""
    return str(resolve_model_path(path))


def load_data(spec: str, cfg: TrainConfig, run_dir: Path, *, eval_set: bool) -> PromptDataset:
    """Read a jsonl file, or generate a ``gen:`` set (written to RUN_DIR/data/ for inspection)."""
    if spec in GENERATED_SETS:
        path = run_dir / "data" / f"{spec.removeprefix('gen:')}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        spec = str(write_prompt_data(path, GENERATED_SETS[spec]()))
    ds = load_prompt_data(
        spec,
        input_key=cfg.input_key,
        label_key=cfg.label_key,
        strict=cfg.strict_data,
    )
    if ds.skipped:
        first = ds.skipped[0]
        logger.warning(
            "%s: skipped %d bad record(s); first: line %d: %s",
            spec,
            len(ds.skipped),
            first.line,
            first.reason,
        )
    return ds


def _prepare_run_dir(cfg: TrainConfig) -> Path:
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.overwrite_run_dir and cfg.load is None:
        clear_run_records(run_dir)  # preflight refused this folder without the flag
    (run_dir / "config.json").write_text(cfg.model_dump_json(indent=1))
    return run_dir


@dataclass
class RunRecord:
    """What a run recorded across its restarts, for the closing summary: the steps and the
    evaluations (a restart keeps those up to its checkpoint's step, the redone ones replace
    the rest), and the restarts."""

    history: list[StepRecord] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    #: the first placement's bundles (GPUs or CPUs): a restart asks for the same kind, whatever
    #: a cluster that lost a node has left for now
    use_gpus: bool | None = None
    #: Ray's error for the process the last restart replaced
    lost: BaseException | None = None

    def restart(self, restart: Restart, err: BaseException) -> None:
        """Forget what comes after the restart's checkpoint step (it is redone)."""
        self.lost = err
        self.history[:] = [h for h in self.history if h.step <= restart.step]
        self.evals[:] = [e for e in self.evals if int(e.get("step", 0)) <= restart.step]
        self.restarts.append(restart)


@dataclass
class _Run:
    """What every attempt of a run shares: the rollout engine, where the run writes and its
    record over restarts, its console, clock and start-up times, the stop request and the W&B
    mirror."""

    rollout_engine: str
    run_dir: Path
    record: RunRecord
    console: Console
    clock: PhaseClock
    startup: PhaseTimes
    stop: StopRequest | None
    mirror: WandbMirror | None


async def run_training(
    cfg: TrainConfig, console: Console | None = None, stop: StopRequest | None = None
) -> int:
    """Run the whole job from a config: the realised plan, then the GRPO loop. Exit status.

    With ``stop``, SIGTERM / SIGINT are handled from the moment Ray is up: during start-up
    they cancel the run, in the loop they stop it at a safe point with the last completed step
    saved; the status is then ``stop.exit_code`` and ``stop_report`` says what was saved.

    A lost trainer rank (or another process that cannot be re-created in place) restarts the
    run from its last checkpoint, up to ``--max-restarts`` times (``rl_core.restarts``): in
    place where only trainer ranks were lost and the placement groups are intact (the judge
    service kept, :func:`_train_once`), else with what the run stands on torn down and built
    again on the same Ray. Without a restart left,
    :class:`~rl_core.restarts.RunLostError` (raised from Ray's error) says why.

    With ``--use-wandb`` the W&B run starts first (a refused start costs no Ray start-up) and
    is closed however the run ends.
    """
    apply_ray_env_defaults(disable_auth=True)
    console = console or make_console(stderr=True)
    run_dir = await asyncio.to_thread(_prepare_run_dir, cfg)
    mirror = await asyncio.to_thread(WandbMirror, cfg, run_dir) if cfg.use_wandb else None
    status = 1
    try:
        status = await _run_training(cfg, console, stop, run_dir, mirror)
        return status
    finally:
        if mirror is not None:
            await asyncio.to_thread(mirror.finish, status)


async def _run_training(
    cfg: TrainConfig,
    console: Console,
    stop: StopRequest | None,
    run_dir: Path,
    mirror: WandbMirror | None,
) -> int:
    clock = PhaseClock(console)
    startup: PhaseTimes = {}
    console.print(render_plan(cfg.plan))
    rollout_engine = resolve_rollout_engine(cfg)  # refused here, before anything starts
    record = RunRecord()
    run = _Run(rollout_engine, run_dir, record, console, clock, startup, stop, mirror)

    async with AsyncExitStack() as ray_stack:
        with clock.timed("ray", startup):
            connect_ray(cfg.plan, ray_stack, stop)
        attempt = cfg
        while True:
            try:
                trainer, learner = await _train_once(attempt, run)
                break
            except RunLostError:
                raise  # decided inside (a restart in place that could not go on)
            except PlacementUnavailableError as err:
                if record.lost is None:
                    raise
                # a restart the cluster cannot hold within --restart-wait-s (a node lost for
                # good): the run ends on the process it lost, with the command that resumes
                raise RunLostError(f"no restart: {err}") from record.lost
            except Exception as err:
                attempt = restarted_config(cfg, _restart_or_raise(cfg, err, record, stop))
    if trainer.stop_report is not None and stop is not None:
        stop.report = trainer.stop_report
        return stop.exit_code

    from rl_core.plot import plot_run
    from rl_core.summary import render_summary
    from rl_core.watch import read_watch, watch_warnings

    figures = plot_run(run_dir)
    records = read_metrics(run_dir)
    warnings = watch_warnings(records, read_watch(run_dir))
    render_summary(
        record.history,
        mode=cfg.mode,
        startup=startup,
        total_s=clock.elapsed(),
        precision=learner.precision,
        console=make_console(),
        notes=run_notes(cfg) + [r.note() for r in record.restarts],
        evals=record.evals,
        records=records,
        warnings=warnings,
    )
    stdout = make_console()
    stdout.print("[bold]plots[/]: " + ", ".join(str(p) for p in figures))
    if cfg.save_hf:
        stdout.print(f"[bold]model[/]: {cfg.save_hf} (HF folder, {cfg.save_hf_dtype})")
    if mirror is not None:
        mirror.log_figures(figures)
        mirror.log_summary({"watch/warnings": warnings})
        how = "offline, upload with `wandb sync` " if mirror.mode == "offline" else ""
        stdout.print(f"[bold]W&B[/]: {how}{mirror.where}")
    return 0


def _restart_or_raise(
    cfg: TrainConfig, err: Exception, record: RunRecord, stop: StopRequest | None
) -> Restart:
    """The restart ``err`` (a lost process) calls for, recorded; else ``err`` raised again, or
    :class:`RunLostError` saying why the lost process ends the run (``rl_core.restarts``)."""
    stopping = stop is not None and stop.requested
    decided = decide_restart(cfg, err, len(record.restarts), stopping=stopping)
    if decided is None:
        raise err
    if isinstance(decided, str):
        raise RunLostError(decided) from err
    logger.warning("%s", decided.line(cfg.max_restarts))
    record.restart(decided, err)
    return decided


async def _train_once(cfg: TrainConfig, run: _Run) -> tuple[GRPOTrainer, Any]:
    """One go of the run on the Ray that is up: placement groups, services, the loop; all of
    it torn down when it ends, however it ends (a restart builds it again).

    A lost trainer rank whose placement groups are intact (its node is up) restarts the run in
    place: the trainer ranks and rollout engines are ended and re-created in their bundles, and
    the placement groups and the judge service, with its judges' loaded models, are kept."""
    async with AsyncExitStack() as stack:
        with run.clock.timed("ray", run.startup):  # the placement groups (a restart's too)
            realized = await place(
                cfg.plan,
                stack,
                use_gpus=run.record.use_gpus,
                timeout_s=cfg.restart_wait_s if run.record.restarts else PLACEMENT_TIMEOUT_S,
            )
            run.record.use_gpus = realized.use_gpus
        with run.clock.timed("models", run.startup):
            policy_path = await asyncio.to_thread(resolve_model, cfg.hf_checkpoint)
        judge: JudgeService | None = None
        while True:
            async with AsyncExitStack() as attempt:
                services = await start_services(
                    cfg,
                    realized,
                    policy_path,
                    run.rollout_engine,
                    attempt,
                    run.console,
                    run.clock,
                    run.startup,
                    judge=judge,
                    judge_stack=stack,
                )
                judge = services.judge_service
                trainer = await _trainer_on(cfg, run, realized, policy_path, services, attempt)
                try:
                    await trainer.run()
                except Exception as err:
                    lost = await _as_lost_process(err, services)
                    if not await _restarts_in_place(lost, realized):
                        raise lost  # noqa: B904 - its own cause kept (Ray's error for the process)
                    restart = _restart_or_raise(cfg, lost, run.record, run.stop)
                    logger.warning(
                        "restart %d in place: the placement groups and the judge service stay; "
                        "the trainer ranks and rollout engines are re-created in their bundles",
                        restart.number,
                    )
                    if judge is not None:  # asleep or awake, as the lost step left them
                        judge.states = {w: services.phases.states[w] for w in judge.sleepers}
                    await services.end_trainer_and_rollout()
                    cfg = restarted_config(cfg, restart)
                    continue
                await shutdown_engines(services.engines)
                return trainer, services.groups["actor"]


async def _trainer_on(
    cfg: TrainConfig,
    run: _Run,
    realized: Any,
    policy_path: str,
    services: Services,
    stack: AsyncExitStack,
) -> GRPOTrainer:
    """The GRPO trainer on the started services: weight sync, layout record, rewards, data,
    evaluation, metrics and checkpoints; what it opens is closed by ``stack``."""
    learner = services.groups["actor"]
    tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, policy_path)
    weight_sync = await start_weight_sync(
        cfg, realized, run.rollout_engine, services, run.console, run.clock, run.startup
    )
    layout = await read_layout(realized, services.groups, services.engines, services.judge_engines)
    await asyncio.to_thread(write_layout, run.run_dir, layout)

    seeded = rollout_seeded(cfg, run.rollout_engine)
    if not seeded:
        run.console.print(
            "[bold]rollout sampling[/]: not seeded (SGLang honours a seed only with "
            "--sglang-enable-deterministic-inference)"
        )
    every_engine: list[RemoteEngine | RecoverableEngine] = [*services.engines]
    every_engine += [e for v in services.judge_engines.values() for e in v]
    rewards = reward_setup(cfg, judge=services.judge)
    train_data = load_data(cfg.prompt_data, cfg, run.run_dir, eval_set=False)
    eval_data = (
        load_data(cfg.eval_prompt_data, cfg, run.run_dir, eval_set=True)
        if cfg.eval_prompt_data
        else None
    )
    evaluation = Evaluation(cfg, eval_data)
    evaluation.history = run.record.evals  # one run.record of the run's evaluations, over restarts
    metrics = MetricsWriter(run.run_dir, mirror=run.mirror)
    stack.callback(metrics.close)  # TensorBoard's file closed however this ends
    trainer = GRPOTrainer(
        cfg,
        seeded=seeded,
        learner=learner,
        tokenizer=tokenizer,
        rollout_engines=services.engines,
        phases=services.phases,
        rewards=rewards,
        train_data=train_data,
        evaluation=evaluation,
        checkpoints=Checkpointer(cfg, learner),
        stop=run.stop,
        reference=services.groups.get("reference"),
        actor_fwd=services.groups.get("actor_fwd"),
        overlap=cfg.plan.phases_overlap,
        metrics=metrics,
        clock=run.clock,
        weight_sync=weight_sync,
        memory_probe=GpuMemoryProbe(learner, every_engine) if realized.use_gpus else None,
        restarts=run.record.restarts,
    )
    trainer.history = run.record.history  # the same: a restart keeps the steps it does not redo
    if weight_sync.path == "object_store" and not cfg.plan.phases_overlap:
        # a rollout engine whose actor dies is re-created with rank 0's weights (not in
        # fully-async: rank 0 trains meanwhile, its weights are not the engine's version)
        for engine in services.engines:
            engine.weights = learner.export_weights
    if run.stop is not None:
        stack.callback(run.stop.abrupt)  # a run that fails unwinds without waiting for a step
    return trainer


async def _as_lost_process(err: Exception, services: Services) -> Exception:
    """``err``, or the lost process behind it: a step that failed for a reason of its own
    (its judge failures, a deadline) may have lost a process behind it (a node gone takes the
    judge engine's answers first). Asked, a trainer rank or rollout engine that is gone makes
    it a lost process, which restarts the run (``rl_core.restarts``) instead of ending it."""
    if lost_actor_error(err) is not None or isinstance(err, PlacementUnavailableError):
        return err
    learner = services.groups["actor"]
    actors = [(("trainer rank", f"actor-{r}"), w) for r, w in enumerate(learner.workers)]
    actors += [(("engine", e.name), e.handle) for e in services.engines]
    lost = await find_lost_actor(actors, FAILED_STEP_PROBE_S)
    if lost is None:
        return err
    (what, name), ray_err = lost
    found = ProcessLostError(f"{type(err).__name__}: {err}", what, name)
    found.__cause__ = ray_err
    return found


async def _restarts_in_place(err: Exception, realized: Any) -> bool:
    """Whether ``err`` is a lost trainer rank whose bundles are all still there (its node up,
    every placement group created): its restart re-creates the trainer and rollout engines
    there and keeps the judge service."""
    ray_err = lost_actor_error(err)
    if ray_err is None or node_lost(ray_err) or not lost_trainer_rank(err):
        return False
    return bool(await asyncio.to_thread(realized.intact))


def run_notes(cfg: TrainConfig) -> list[str]:
    """What the summary should say about how the run was set up."""
    notes = []
    if cfg.use_kl_loss and cfg.kl_loss_coef == 0.0:
        notes.append(
            "KL to a reference is not computed: --use-kl-loss with --kl-loss-coef 0 loads no "
            "reference model (the loss would not change); give a coefficient > 0 to train with it"
        )
    if cfg.train_backend == "megatron":
        from rl_core.backends.megatron import kernels_note

        note = kernels_note()
        if note is not None:
            notes.append(note)
    return notes
