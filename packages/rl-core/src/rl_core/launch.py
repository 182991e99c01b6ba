"""From a config to a running GRPO job: the plan realised on Ray, then the loop.

This is the only module that knows where things run, and :func:`run_training` reads like the
set-up of the algorithm: placement groups from the plan → rollout engines, as many and as large as
the plan's, each in its bundles → judge engines per instance in theirs, handed to the judge
service (which then creates no placement group of its own) → the trainer group (one Ray actor per
actor GPU, one ``torch.distributed`` group) → the GRPO loop. Roles on disjoint GPUs start at the
same time (split: rollout and judges; fully-async: the trainer too). The same path runs on a GPU
cluster and on a CPU machine (bundles of CPUs, or Ray's logical GPUs with ``--device cpu``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from transformers import AutoTokenizer

from genrm_client import close_genrm_clients
from genrm_serve import (
    CapacityError,
    EngineActor,
    EngineConfig,
    EnginePlacement,
    EngineRef,
    EngineStartError,
    InstanceSpec,
    ServeArgs,
    apply_ray_env_defaults,
    build_app,
    check_fits,
    deploy,
    engine_id_for,
    resolve_model_path,
    shutdown_serve,
    start_proxy,
    wait_until_healthy,
)
from rl_core.config import GENERATED_DATA, TrainConfig
from rl_core.data import PromptDataset, load_prompt_data, make_easy_math, write_prompt_data
from rl_core.distributed import ForwardGroup, TrainGroup
from rl_core.engines import engine_actor
from rl_core.layout import read_layout, write_layout
from rl_core.limits import (
    ENGINE_PROBE_TIMEOUT_S,
    ENGINE_START_TIMEOUT_S,
    RAY_CALL_SETTLE_S,
)
from rl_core.metrics import MetricsWriter, PhaseClock
from rl_core.participants import judge_id
from rl_core.phases import CallbackSleeper, GroupSleeper, PhaseMachine, Sleeper, phases_from_plan
from rl_core.placement import (
    PlacementError,
    PlacementPlan,
    PlacementUnavailableError,
    render_plan,
)
from rl_core.placement.realize import (
    RealizedPlacement,
    create_engine_workers,
    create_judge_engines,
    create_placement_groups,
)
from rl_core.placement.sglang_flags import DETERMINISTIC_KEY
from rl_core.rewards import PostProcessHook, custom_post_process, defer_swap_post_process
from rl_core.stopping import StopRequest
from rl_core.trainer import GRPOTrainer, RewardSetup
from rl_core.weight_sync import WeightSync, choose_weight_sync, make_weight_sync

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: Seeds of the demo's generated data sets (train and held-out evaluation differ).
EASY_MATH_TRAIN = (256, 11)
EASY_MATH_EVAL = (64, 977)


def resolve_model(path: str) -> str:
    """A local model folder: ``embedded[:name]`` becomes genrm-serve's cached safetensors copy
    of the embedded model (converted from GGUF once), anything else must be a model folder."""
    return str(resolve_model_path(path))


def load_data(spec: str, cfg: TrainConfig, run_dir: Path, *, eval_set: bool) -> PromptDataset:
    """Read a jsonl file, or generate the demo set (written to RUN_DIR/data/ for inspection)."""
    if spec in GENERATED_DATA:
        n, seed = EASY_MATH_EVAL if spec.endswith("-eval") else EASY_MATH_TRAIN
        path = run_dir / "data" / f"{spec.removeprefix('gen:')}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        spec = str(write_prompt_data(path, make_easy_math(n, seed=seed)))
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
    (run_dir / "config.json").write_text(cfg.model_dump_json(indent=1))
    return run_dir


class JudgeSleeper:
    """Sleep / wake one judge instance through the service (genrm-client: API key, retries)."""

    def __init__(self, url: str, route_key: str) -> None:
        self.url, self.route_key = url, route_key

    async def sleep(self) -> None:
        from genrm_client import get_genrm_client

        await get_genrm_client(self.url).sleep(self.route_key)

    async def wake(self) -> None:
        from genrm_client import get_genrm_client

        await get_genrm_client(self.url).wake_up(self.route_key)


def _reward_setup(cfg: TrainConfig) -> RewardSetup:
    from genrm_rewards.registry import load_custom, resolve_reward_fn

    if cfg.defer_reward_to_post_process:
        from genrm_rewards.defer import score_deferred

        hook: PostProcessHook = defer_swap_post_process
        if cfg.custom_reward_post_process_path:
            user_hook = load_custom(
                cfg.custom_reward_post_process_path, setting="--custom-reward-post-process-path"
            )
            hook = custom_post_process(user_hook)
        return RewardSetup(
            args=cfg,
            reward_key=cfg.reward_key,
            inline_fn=None,
            batch_fn=score_deferred,
            post_process=hook,
            concurrency=cfg.reward_concurrency,
        )
    return RewardSetup(
        args=cfg,
        reward_key=cfg.reward_key,
        inline_fn=resolve_reward_fn(cfg),
        concurrency=cfg.reward_concurrency,
    )


def resolve_rollout_engine(cfg: TrainConfig) -> str:
    """``--rollout-engine auto``: SGLang where it is installed and compute is on GPUs, else hf.

    The hf engine is one device: a layout that gives it more GPUs per engine is refused here,
    before anything starts (an explicit ``hf`` is refused by the plan already).
    """
    kind = cfg.layout.rollout_engine
    if kind == "auto":
        kind = "sglang" if cfg.device != "cpu" and importlib.util.find_spec("sglang") else "hf"
    per_engine = cfg.layout.rollout_num_gpus_per_engine
    if kind == "hf" and cfg.layout.rollout_server_args:
        raise PlacementError(
            f"--sglang-config / --sglang-* {sorted(cfg.layout.rollout_server_args)}: SGLang "
            "server arguments, but the rollout engine is hf (--rollout-engine sglang, or drop them)"
        )
    if kind == "hf" and per_engine > 1:
        raise PlacementError(
            f"--rollout-num-gpus-per-engine {per_engine}: SGLang is not installed here, and the "
            "hf rollout engine runs on one device (1 GPU per engine); install SGLang (see the "
            "genrm-serve README) or use --rollout-num-gpus-per-engine 1"
        )
    return kind


def _engine_spec(
    spec: InstanceSpec,
    device: str,
    mem_fraction_static: float | None = None,
    *,
    sleeps: bool = False,
) -> InstanceSpec:
    """The spec an engine starts with: ``--device cpu`` computes on CPU whatever bundle the
    engine sits in, the plan's memory fraction (e.g. defer-swap's default) is applied, and an
    engine the plan puts to sleep allocates its host buffers at start (so its first sleep is a
    copy, like every later one)."""
    update: dict[str, Any] = {}
    if device != "auto":
        update["device"] = device
    if mem_fraction_static is not None:
        update["mem_fraction_static"] = mem_fraction_static
    if sleeps:
        update["sleep_buffers"] = "start"
    if not update:
        return spec
    return spec.model_copy(update={"engine_config": spec.engine_config.model_copy(update=update)})


def rollout_seeded(cfg: TrainConfig, engine: str) -> bool:
    """Whether the rollout engines honour a per-sample sampling seed: hf always, SGLang only with
    deterministic inference (else it refuses a seeded request; an unseeded rollout is SGLang's
    and the original's default)."""
    return engine != "sglang" or bool(cfg.layout.rollout_server_args.get(DETERMINISTIC_KEY))


def rollout_spec(cfg: TrainConfig, policy_path: str, engine: str) -> InstanceSpec:
    """The rollout engines as genrm-serve sees them: an instance of the plan's engines."""
    plan = cfg.plan
    engines = plan.engines_of("rollout")
    per_engine = len(engines[0].bundles) if engines else 1
    server_args = dict(cfg.layout.rollout_server_args) if engine == "sglang" else {}
    deterministic = bool(server_args.pop(DETERMINISTIC_KEY, False))
    spec = InstanceSpec(
        route_key="rollout",
        model_path=policy_path,
        num_gpus=per_engine * max(len(engines), 1),
        num_gpus_per_engine=per_engine,
        engine=engine,
        engine_config=EngineConfig(
            max_batch_size=max(cfg.n_samples_per_prompt, 1) * 4,
            max_context_len=(cfg.rollout_max_prompt_len or 4096) + cfg.rollout_max_response_len,
            server_args=server_args,
            deterministic_inference=deterministic,
        ),
    )
    return _engine_spec(
        spec,
        cfg.device,
        engines[0].mem_fraction_static if engines else None,
        sleeps=plan.sleeps("rollout"),
    )


def judge_specs(cfg: TrainConfig) -> dict[str, InstanceSpec]:
    """The judge instances as their engines start: each with its plan's memory fraction."""
    plan = cfg.plan
    return {
        k: _engine_spec(
            s, cfg.device, plan.judges[k].mem_fraction_static, sleeps=plan.sleeps(judge_id(k))
        )
        for k, s in cfg.genrm_instances.items()
    }


async def _ray_call_in_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn`` (blocking, it calls Ray's API) in a thread. Cancelled (Ctrl-C during start-up),
    it still lets the call return, for up to :data:`RAY_CALL_SETTLE_S`, before the
    cancellation goes on to ``ray.shutdown``: a Ray call made after the shutdown ends the whole
    process from that thread (exit 1, no clean-up)."""
    call = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(call, RAY_CALL_SETTLE_S)
        raise


async def _timed(startup: dict[str, float], key: str, step: Awaitable[T]) -> T:
    """Await ``step``, recording its seconds under ``key``."""
    t0 = time.perf_counter()
    try:
        return await step
    finally:
        startup[key] = time.perf_counter() - t0


async def _one_after_another(
    steps: dict[str, Coroutine[Any, Any, Any]], startup: dict[str, float]
) -> dict[str, Any]:
    done: dict[str, Any] = {}
    try:
        for k, step in steps.items():
            done[k] = await _timed(startup, k, step)
    finally:
        for step in steps.values():
            step.close()  # the steps a failure left unstarted (a no-op for the others)
    return done


async def _together(
    steps: dict[str, Coroutine[Any, Any, Any]], startup: dict[str, float]
) -> dict[str, Any]:
    """Run the start-up steps at once. The first failure cancels the others (a task group) and
    is the error raised, as it would be one after another (not an ``ExceptionGroup``)."""
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = {k: tg.create_task(_timed(startup, k, s)) for k, s in steps.items()}
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None
    return {k: t.result() for k, t in tasks.items()}


async def start_rollout_engines(
    realized: RealizedPlacement, spec: InstanceSpec, name_prefix: str
) -> list[EngineActor]:
    """One engine actor per rollout engine of the plan, in its bundles, started concurrently."""
    handles = create_engine_workers(realized, "rollout", spec, name_prefix=name_prefix)
    engines = [engine_actor(h, f"rollout-{i}") for i, h in enumerate(handles)]
    try:
        await asyncio.gather(*(e.start(timeout_s=ENGINE_START_TIMEOUT_S) for e in engines))
    except Exception as err:  # the engine's own error, in one line, not Ray's remote traceback
        cause = getattr(err, "cause", None) or err
        first = (str(cause).strip().splitlines() or [""])[0]
        raise EngineStartError(
            f"a rollout engine ({spec.model_path}) did not start: {type(cause).__name__}: {first}"
        ) from err
    return engines


async def start_judge_service(
    realized: RealizedPlacement,
    instances: dict[str, InstanceSpec],
    stack: AsyncExitStack,
    port: int | None = None,
) -> tuple[str, dict[str, list[Any]]]:
    """The judge engines in the plan's bundles, handed to the service (which then creates no
    placement group of its own and re-creates a dead engine in the same bundle)."""
    actors = create_judge_engines(realized, instances)
    refs = {
        key: [
            EngineRef(
                handle=actor,
                placement=EnginePlacement(
                    placement_group=realized.placement_groups[engine.group],
                    bundle_index=realized.slot(engine.group, engine.bundles[0]).bundle_index,
                    num_gpus=realized.engine_options(engine)["num_gpus"],
                    num_cpus=realized.engine_options(engine)["num_cpus"],
                ),
            )
            for actor, engine in zip(
                actors[key], realized.plan.engines_of("genrm", key), strict=True
            )
        ]
        for key in instances
    }
    # Serve is shut down however this ends (a start cut short too); both block: off the loop,
    # which meanwhile starts what else the plan has.
    stack.push_async_callback(asyncio.to_thread, shutdown_serve)
    host = ServeArgs.model_fields["host"].default
    # the proxy first: on a free port (another one if that was taken before it bound it)
    port = await _ray_call_in_thread(start_proxy, host, port)
    sargs = ServeArgs(host=host, port=port, engine_num_cpus=0.5)
    await _ray_call_in_thread(deploy, build_app(instances, engines=refs, args=sargs), sargs)
    # an engine that cannot start ends the wait with its error (EngineStartError); a cancelled
    # start (Ctrl-C, a failed sibling step) ends it at the next poll, not at the deadline
    stop = threading.Event()
    try:
        await asyncio.to_thread(wait_until_healthy, sargs, ENGINE_START_TIMEOUT_S, stop=stop)
    finally:
        stop.set()
    return sargs.url, actors


def _cluster_gpus() -> float:
    import ray

    return float(ray.cluster_resources().get("GPU", 0.0))  # type: ignore[no-untyped-call]


def _check_capacity(plan: PlacementPlan, use_gpus: bool) -> None:
    """A plan the cluster can never hold (in total, not just free now) is refused at once,
    not after the placement wait; every bundle is ``{GPU: 1, CPU: 1}`` (``{CPU: 1}`` without
    GPUs)."""
    import ray

    bundles = sum(g.num_bundles for g in plan.groups)
    needed = {"CPU": float(bundles)} | ({"GPU": float(bundles)} if use_gpus else {})
    try:
        check_fits(
            needed,
            ray.cluster_resources(),  # type: ignore[no-untyped-call]
            f"the plan ({plan.mode}, {plan.num_gpus} GPUs)",
            hint="add nodes, or shrink --resource",
        )
    except CapacityError as err:
        raise PlacementUnavailableError(str(err)) from err


def _init_ray(plan: PlacementPlan) -> bool:
    """Connect to ``RAY_ADDRESS`` (``ray job submit``) or start a local Ray; True if we started it.

    A local Ray gets logical CPUs beyond the cores: each bundle of the plan reserves one, and
    the service's processes need some outside the placement groups.
    """
    import ray

    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS") or "local"
    # Engine and Serve logs stay in Ray's session logs; the driver shows the phases.
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address == "local":
        kwargs["num_cpus"] = (os.cpu_count() or 2) + plan.num_gpus + 2
    ray.init(address=address, **kwargs)
    return True


async def _start_ray(
    plan: PlacementPlan, stack: AsyncExitStack, stop: StopRequest | None
) -> RealizedPlacement:
    """Ray up (ours shut down on exit), the plan checked against the cluster and placed."""
    import ray

    if stop is not None:
        stop.install()
        stack.callback(stop.uninstall)
    if _init_ray(plan):
        stack.callback(ray.shutdown)
    if stop is not None:
        stop.install()  # again: ray.init installs a SIGTERM handler that dumps and aborts
    use_gpus = _cluster_gpus() > 0
    _check_capacity(plan, use_gpus)
    realized = await _ray_call_in_thread(create_placement_groups, plan, use_gpus=use_gpus)
    stack.callback(realized.remove)
    return realized


@dataclass
class _Services:
    """What the GRPO loop runs on: the engines, the trainer groups and the phase machine."""

    engines: list[EngineActor]
    judge_engines: dict[str, list[EngineActor]]
    groups: dict[str, Any]
    phases: PhaseMachine


async def _use_judge_service(
    url: str, instances: Mapping[str, InstanceSpec], stack: AsyncExitStack, console: Console
) -> None:
    # reward functions use genrm-client's process-wide client, which reads GENRM_URL when it is
    # created: drop any made before this service existed, and close ours last
    os.environ["GENRM_URL"] = url
    await close_genrm_clients()
    stack.push_async_callback(close_genrm_clients)
    console.print(f"[bold]judge service[/]: {url} ({', '.join(instances)})")


async def _start_services(
    cfg: TrainConfig,
    realized: RealizedPlacement,
    policy_path: str,
    rollout_engine: str,
    stack: AsyncExitStack,
    console: Console,
    startup: dict[str, float],
) -> _Services:
    """Engines first, then the trainer: on a shared GPU each role loads within its share. What
    sits on disjoint GPUs starts at the same time (a start is mostly waiting on processes,
    imports and model loads); what shares a GPU starts one after another."""
    plan = cfg.plan
    prefix = f"rl-core-{uuid.uuid4().hex[:6]}:"
    instances = judge_specs(cfg) if cfg.genrm_enabled else {}
    rollout = rollout_spec(cfg, policy_path, rollout_engine)
    steps: dict[str, Coroutine[Any, Any, Any]] = {
        "rollout_engines": start_rollout_engines(realized, rollout, prefix)
    }
    if instances:
        steps["judge_service"] = start_judge_service(realized, instances, stack, cfg.genrm_port)
    if plan.phases_overlap:  # fully-async: the trainer's GPUs are its own
        steps["trainer"] = start_trainer_groups(cfg, realized, policy_path, prefix)
    if plan.shares_gpus("rollout", "genrm"):
        started = await _one_after_another(steps, startup)
    else:
        started = await _together(steps, startup)
    engines: list[EngineActor] = started["rollout_engines"]

    participants: dict[str, Sleeper] = {"rollout": GroupSleeper(engines)}
    judge_engines: dict[str, list[EngineActor]] = {}
    if instances:
        url, judge_actors = started["judge_service"]
        await _use_judge_service(url, instances, stack, console)
        participants.update({judge_id(k): JudgeSleeper(url, k) for k in instances})
        judge_engines = {
            key: [engine_actor(a, engine_id_for(key, i)) for i, a in enumerate(actors)]
            for key, actors in judge_actors.items()
        }

    phases = PhaseMachine(phases_from_plan(plan), participants)
    if plan.phases_overlap:
        groups = started["trainer"]
    else:
        # Colocated: the engines sharing the actor's GPUs sleep (as in the train phase)
        # before the trainer loads, so its weights never meet theirs at start-up.
        t0 = time.perf_counter()
        await phases.enter("train")
        startup["engines_sleep"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        groups = await start_trainer_groups(cfg, realized, policy_path, prefix)
        startup["trainer"] = time.perf_counter() - t0
    learner = groups["actor"]
    phases.add("actor", CallbackSleeper(learner.offload, learner.onload))
    return _Services(engines, judge_engines, groups, phases)


async def _weight_sync(
    cfg: TrainConfig,
    realized: RealizedPlacement,
    rollout_engine: str,
    services: _Services,
    console: Console,
    startup: dict[str, float],
) -> WeightSync:
    """The plan's weight path between the actor and the rollout engines, set up."""
    path = choose_weight_sync(
        cfg.plan, use_gpus=realized.use_gpus, device=cfg.device, engine=rollout_engine
    )
    sync = make_weight_sync(path, services.groups["actor"], services.engines, plan=cfg.plan)
    t0 = time.perf_counter()
    await sync.setup()
    startup["weight_sync_setup"] = time.perf_counter() - t0
    console.print(f"[bold]weight sync[/]: {path}")
    return sync


async def run_training(
    cfg: TrainConfig, console: Console | None = None, stop: StopRequest | None = None
) -> int:
    """Run the whole job from a config: the realised plan, then the GRPO loop. Exit status.

    With ``stop``, SIGTERM / SIGINT are handled from the moment Ray is up: during start-up
    they cancel the run, in the loop they stop it at a safe point with the last completed step
    saved; the status is then ``stop.exit_code`` and ``stop_report`` says what was saved.
    """
    apply_ray_env_defaults(disable_auth=True)
    console = console or Console(stderr=True)
    t_start = time.perf_counter()
    startup: dict[str, float] = {}
    run_dir = await asyncio.to_thread(_prepare_run_dir, cfg)
    console.print(render_plan(cfg.plan))
    rollout_engine = resolve_rollout_engine(cfg)  # refused here, before anything starts

    async with AsyncExitStack() as stack:
        realized = await _timed(startup, "ray", _start_ray(cfg.plan, stack, stop))
        policy_path = await _timed(
            startup, "models", asyncio.to_thread(resolve_model, cfg.hf_checkpoint)
        )
        services = await _start_services(
            cfg, realized, policy_path, rollout_engine, stack, console, startup
        )
        learner = services.groups["actor"]
        tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, policy_path)
        weight_sync = await _weight_sync(cfg, realized, rollout_engine, services, console, startup)
        layout = await read_layout(
            realized, services.groups, services.engines, services.judge_engines
        )
        await asyncio.to_thread(write_layout, run_dir, layout)

        seeded = rollout_seeded(cfg, rollout_engine)
        if not seeded:
            console.print(
                "[bold]rollout sampling[/]: not seeded (SGLang honours a seed only with "
                "--sglang-enable-deterministic-inference)"
            )
        every_engine = services.engines + [e for v in services.judge_engines.values() for e in v]
        trainer = GRPOTrainer(
            cfg,
            seeded=seeded,
            learner=learner,
            tokenizer=tokenizer,
            rollout_engines=services.engines,
            phases=services.phases,
            rewards=_reward_setup(cfg),
            train_data=load_data(cfg.prompt_data, cfg, run_dir, eval_set=False),
            eval_data=load_data(cfg.eval_prompt_data, cfg, run_dir, eval_set=True)
            if cfg.eval_prompt_data
            else None,
            reference=services.groups.get("reference"),
            actor_fwd=services.groups.get("actor_fwd"),
            overlap=cfg.plan.phases_overlap,
            metrics=MetricsWriter(run_dir),
            clock=PhaseClock(console),
            weight_sync=weight_sync,
            memory_probe=GpuMemoryProbe(learner, every_engine) if realized.use_gpus else None,
            stop=stop,
        )
        if stop is not None:
            stack.callback(stop.abrupt)  # a run that fails unwinds without waiting for a step
        history = await trainer.run()
    if trainer.stop_report is not None and stop is not None:
        stop.report = trainer.stop_report
        return stop.exit_code

    from rl_core.plot import plot_run
    from rl_core.summary import render_summary

    figures = plot_run(run_dir)
    render_summary(
        history,
        mode=cfg.mode,
        startup=startup,
        total_s=time.perf_counter() - t_start,
        precision=learner.precision,
        console=Console(),
        notes=run_notes(cfg),
        evals=trainer.eval_history,
    )
    Console().print("[bold]plots[/]: " + ", ".join(str(p) for p in figures))
    return 0


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


class GpuMemoryProbe:
    """Used memory of every GPU of the run, read where it is used (``mem_get_info`` in each
    trainer rank and engine: it counts every process on that GPU). Keyed ``gpu<id>`` (with
    ``n<k>.`` for node ``k`` when the run spans nodes); GPUs without a CUDA reader are absent
    (``--device cpu``)."""

    def __init__(self, learner: Any, engines: list[EngineActor]) -> None:
        self.learner, self.engines = learner, engines
        self._engine_gpus: list[tuple[str, str]] | None = None

    async def _engines_where(self) -> list[tuple[str, str]]:
        if self._engine_gpus is None:
            infos = await asyncio.gather(
                *(e.info(timeout_s=ENGINE_PROBE_TIMEOUT_S) for e in self.engines)
            )
            self._engine_gpus = [
                (str(i.get("node_id")), str((i.get("gpu_ids") or ["?"])[0])) for i in infos
            ]
        return self._engine_gpus

    async def __call__(self) -> dict[str, float]:
        ranks, where, stats = await asyncio.gather(
            self.learner.memory(),
            self._engines_where(),
            asyncio.gather(*(e.stats(timeout_s=ENGINE_PROBE_TIMEOUT_S) for e in self.engines)),
        )
        readings: dict[tuple[str, str], float] = {}
        for r in ranks:
            if "gpu_used_bytes" in r and r.get("gpu_ids"):
                key = (str(r.get("node_id", "")), str(r["gpu_ids"][0]))
                readings[key] = max(readings.get(key, 0.0), float(r["gpu_used_bytes"]))
        for (node, gpu), st in zip(where, stats, strict=True):
            if "gpu_used_bytes" in st:
                key = (node, gpu)
                readings[key] = max(readings.get(key, 0.0), float(st["gpu_used_bytes"]))
        # rank and engine reports name nodes differently; fold by GPU id on one node
        nodes = sorted({n for n, _ in readings if n})
        out: dict[str, float] = {}
        for (node, gpu), used in sorted(readings.items()):
            prefix = f"n{nodes.index(node)}." if len(nodes) > 1 and node in nodes else ""
            name = f"{prefix}gpu{gpu}"
            out[name] = max(out.get(name, 0.0), used / 1e9)
        return out


async def start_trainer_groups(
    cfg: TrainConfig, realized: RealizedPlacement, policy_path: str, prefix: str
) -> dict[str, Any]:
    """The actor's data-parallel group, and in fully-async the forward-only roles' groups.

    In colocate the reference (if the KL loss needs one) lives in each actor rank; in
    fully-async ``reference`` and ``actor_fwd`` are ranks of their own on their own GPUs.
    """
    roles = realized.plan.roles
    separate = realized.plan.phases_overlap
    own_reference = separate and "reference" in roles
    groups: dict[str, Any] = {
        "actor": TrainGroup(
            realized,
            "actor",
            policy_path,
            cfg.backend,
            device=cfg.device,
            name_prefix=prefix,
            load_reference=False if own_reference else None,
            train_backend=cfg.train_backend,
            megatron=cfg.megatron,
        )
    }
    if separate:
        for role in ("reference", "actor_fwd"):
            if role in roles:
                groups[role] = ForwardGroup(
                    realized,
                    role,
                    policy_path,
                    cfg.backend,
                    device=cfg.device,
                    name_prefix=prefix,
                    load_reference=False,
                )
    await asyncio.gather(*(g.start() for g in groups.values()))
    return groups
