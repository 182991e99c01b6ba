"""Starting and stopping what a run runs on: Ray, the rollout engines, the judge service, the
trainer groups and the weight path between them.

Everything started here is stopped by the run's exit stack, however the run ends (a failed or
cancelled start-up too): Serve, the placement groups, the Ray we started, the judge clients. Roles
on disjoint GPUs start at the same time (split: rollout and judges; fully-async: the trainer too);
roles that share a GPU start one after another, each within its share. Every start-up step is
timed by the run's :class:`~rl_core.metrics.PhaseClock` (the summary's ``start-up`` line).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rich.console import Console

from genrm_client import AsyncGenRMClient, close_genrm_clients, get_genrm_client
from genrm_serve import (
    CapacityError,
    EnginePlacement,
    EngineRef,
    EngineStartError,
    InstanceSpec,
    RemoteEngine,
    ServeArgs,
    ServeRunningError,
    build_app,
    check_fits,
    check_service_fits,
    cluster_capacity,
    deploy,
    engine_id_for,
    refuse_another_serve,
    shutdown_serve,
    start_proxy,
    wait_until_healthy,
)
from rl_core.config import TrainConfig
from rl_core.distributed import ForwardGroup, TrainGroup
from rl_core.engine_recovery import EngineFactory, RecoverableEngine
from rl_core.engines import engine_actor
from rl_core.limits import (
    ENGINE_START_TIMEOUT_S,
    PLACEMENT_TIMEOUT_S,
    RAY_CALL_SETTLE_S,
    SERVE_DEPLOY_TIMEOUT_S,
    TRAINER_PROBE_TIMEOUT_S,
    TRAINER_START_TIMEOUT_S,
)
from rl_core.metrics import PhaseClock, PhaseTimes
from rl_core.participants import judge_id
from rl_core.phases import (
    CallbackSleeper,
    GroupSleeper,
    PhaseMachine,
    Sleeper,
    State,
    phases_from_plan,
)
from rl_core.placement import PlacementPlan, PlacementUnavailableError
from rl_core.placement.realize import (
    RealizedPlacement,
    create_engine_worker_in,
    create_engine_workers,
    create_judge_engines,
    create_placement_groups,
)
from rl_core.specs import judge_specs, rollout_spec
from rl_core.stopping import StopRequest
from rl_core.waits import Heartbeat, wait_saying
from rl_core.weight_sync import WeightSync, choose_weight_sync, make_weight_sync

__all__ = [
    "JudgeSleeper",
    "Services",
    "connect_ray",
    "place",
    "start_in_turn",
    "start_judge_service",
    "start_ray",
    "start_rollout_engines",
    "start_services",
    "start_together",
    "start_trainer_groups",
    "start_weight_sync",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: Start-up steps by name: each a coroutine that starts something and returns it.
StartSteps = dict[str, Coroutine[Any, Any, Any]]


class JudgeSleeper:
    """Sleep / wake one judge instance through the service (genrm-client: API key, retries)."""

    def __init__(self, url: str, route_key: str) -> None:
        self.url, self.route_key = url, route_key

    async def sleep(self) -> None:
        await get_genrm_client(self.url).sleep(self.route_key)

    async def wake(self) -> None:
        await get_genrm_client(self.url).wake_up(self.route_key)


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


async def _timed(clock: PhaseClock, times: PhaseTimes, key: str, step: Coroutine[Any, Any, T]) -> T:
    with clock.timed(key, times):
        return await step


async def start_in_turn(steps: StartSteps, clock: PhaseClock, times: PhaseTimes) -> dict[str, Any]:
    """Run the start-up steps one after another, each timed under its name; a failure leaves
    the rest unstarted (and closed)."""
    done: dict[str, Any] = {}
    try:
        for k, step in steps.items():
            done[k] = await _timed(clock, times, k, step)
    finally:
        for step in steps.values():
            step.close()  # the steps a failure left unstarted (a no-op for the others)
    return done


async def start_together(steps: StartSteps, clock: PhaseClock, times: PhaseTimes) -> dict[str, Any]:
    """Run the start-up steps at once, each timed under its name. The first failure cancels
    the others (a task group) and is the error raised, as it would be one after another (not
    an ``ExceptionGroup``)."""
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = {k: tg.create_task(_timed(clock, times, k, s)) for k, s in steps.items()}
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None
    return {k: t.result() for k, t in tasks.items()}


def _rollout_factory(
    realized: RealizedPlacement, spec: InstanceSpec, name_prefix: str, index: int
) -> EngineFactory:
    """How rollout engine ``index`` is made again after its actor died: in the same bundle,
    under a new actor name, started (``rl_core.engine_recovery``)."""
    placed = realized.plan.engines_of("rollout")[index]

    async def make(attempt: int) -> RemoteEngine:
        name = f"{name_prefix}{placed.name}-r{attempt}"
        handle = await _ray_call_in_thread(
            create_engine_worker_in, realized, placed, spec, name=name
        )
        engine = engine_actor(handle, f"rollout-{index}")
        await wait_saying(
            engine.start(timeout_s=ENGINE_START_TIMEOUT_S),
            f"re-created rollout engine rollout-{index} to load {spec.model_path}",
            ENGINE_START_TIMEOUT_S + RAY_CALL_SETTLE_S,
        )
        return engine

    return make


async def start_rollout_engines(
    realized: RealizedPlacement, spec: InstanceSpec, name_prefix: str
) -> list[RecoverableEngine]:
    """One engine actor per rollout engine of the plan, in its bundles, started concurrently;
    each re-created where it was if its actor dies (``rl_core.engine_recovery``)."""
    handles = create_engine_workers(realized, "rollout", spec, name_prefix=name_prefix)
    actors = [engine_actor(h, f"rollout-{i}") for i, h in enumerate(handles)]
    engines = [
        RecoverableEngine(a, _rollout_factory(realized, spec, name_prefix, i))
        for i, a in enumerate(actors)
    ]
    try:
        # each start has its own deadline (the engine's error first); this one only speaks
        await wait_saying(
            asyncio.gather(*(e.start(timeout_s=ENGINE_START_TIMEOUT_S) for e in actors)),
            f"{len(engines)} rollout engine(s) to be scheduled and load {spec.model_path}",
            ENGINE_START_TIMEOUT_S + RAY_CALL_SETTLE_S,
        )
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
    name_prefix: str | None = None,
) -> tuple[str, dict[str, list[Any]]]:
    """The judge engines in the plan's bundles, handed to the service (which then creates no
    placement group of its own and re-creates a dead engine in the same bundle).

    A Serve that already runs on the cluster is not the run's to use (it keeps its own port),
    nor to shut down: refused first (:class:`PlacementUnavailableError`), before anything is
    set to be torn down."""
    try:
        await _ray_call_in_thread(refuse_another_serve, port)
    except ServeRunningError as err:
        raise PlacementUnavailableError(str(err)) from err
    actors = create_judge_engines(realized, instances, name_prefix=name_prefix)
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
    # The ingress routes requests (async I/O, no compute) and asks for no CPU: the plan's
    # bundles may hold every CPU of the cluster (8 bundles of {GPU: 1, CPU: 1} on a node of 8),
    # and a replica that asks for 0.1 more waits unscheduled for ever. What the service still
    # asks outside the placement groups is checked as `genrm-serve run` checks it.
    sargs = ServeArgs(host=host, port=port or 0, engine_num_cpus=0.5, ingress_num_cpus=0.0)
    total, node_max = await _ray_call_in_thread(cluster_capacity)
    try:
        reserved = plan_needs(realized.plan, realized.use_gpus)
        check_service_fits(instances, sargs, total, node_max, reserved=reserved)
    except CapacityError as err:
        raise PlacementUnavailableError(str(err)) from err
    # the proxy first: on a free port (another one if that was taken before it bound it)
    port = await _ray_call_in_thread(start_proxy, host, port)
    sargs = sargs.model_copy(update={"port": port})
    app = build_app(instances, engines=refs, args=sargs)
    what = "the judge service's deploy (Serve's ingress replica)"
    deploying = Heartbeat(what, SERVE_DEPLOY_TIMEOUT_S)
    try:
        await _ray_call_in_thread(
            deploy,
            app,
            sargs,
            timeout_s=SERVE_DEPLOY_TIMEOUT_S,
            progress=deploying,
            progress_every_s=deploying.every_s,
        )
    except TimeoutError as err:  # never scheduled: Serve's message names what it asks for
        raise PlacementUnavailableError(f"{what}: {err}") from err
    # an engine that cannot start ends the wait with its error (EngineStartError); a cancelled
    # start (Ctrl-C, a failed sibling step) ends it at the next poll, not at the deadline
    stop = threading.Event()
    try:
        loading = Heartbeat("the judge engines to load", ENGINE_START_TIMEOUT_S)
        await asyncio.to_thread(
            wait_until_healthy, sargs, ENGINE_START_TIMEOUT_S, stop=stop, progress=loading
        )
    finally:
        stop.set()
    return sargs.url, actors


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
    ranks = sum(g.world_size for g in groups.values())
    # each rank's call has its own deadline (address, setup, model-parallel size): this one
    # holds them and speaks while they run
    await wait_saying(
        asyncio.gather(*(g.start() for g in groups.values())),
        f"{ranks} trainer rank(s) ({', '.join(groups)}) to be scheduled, join and load",
        TRAINER_START_TIMEOUT_S + 3 * TRAINER_PROBE_TIMEOUT_S,
    )
    return groups


# --- Ray -----------------------------------------------------------------------------------------


def _cluster_gpus() -> float:
    import ray

    return float(ray.cluster_resources().get("GPU", 0.0))  # type: ignore[no-untyped-call]


def plan_needs(plan: PlacementPlan, use_gpus: bool) -> dict[str, float]:
    """What the plan's placement groups hold: every bundle is ``{GPU: 1, CPU: 1}`` (``{CPU:
    1}`` without GPUs)."""
    bundles = sum(g.num_bundles for g in plan.groups)
    return {"CPU": float(bundles)} | ({"GPU": float(bundles)} if use_gpus else {})


def _check_capacity(plan: PlacementPlan, use_gpus: bool) -> None:
    """A plan the cluster can never hold (in total, not just free now) is refused at once,
    not after the placement wait."""
    import ray

    needed = plan_needs(plan, use_gpus)
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


async def start_ray(
    plan: PlacementPlan, stack: AsyncExitStack, stop: StopRequest | None
) -> RealizedPlacement:
    """Ray up (ours shut down on exit), the plan checked against the cluster and placed."""
    connect_ray(plan, stack, stop)
    return await place(plan, stack)


def connect_ray(plan: PlacementPlan, stack: AsyncExitStack, stop: StopRequest | None) -> None:
    """Ray up (ours shut down when ``stack`` closes), the stop signals ours from then on."""
    import ray

    if stop is not None:
        stop.install()
        stack.callback(stop.uninstall)
    if _init_ray(plan):
        stack.callback(ray.shutdown)
    if stop is not None:
        stop.install()  # again: ray.init installs a SIGTERM handler that dumps and aborts


async def place(
    plan: PlacementPlan,
    stack: AsyncExitStack,
    *,
    use_gpus: bool | None = None,
    timeout_s: float = PLACEMENT_TIMEOUT_S,
) -> RealizedPlacement:
    """The plan checked against the cluster and placed; its placement groups (and every actor
    in them) removed when ``stack`` closes (a run's end, or its restart: ``rl_core.restarts``).

    A restart passes the first placement's ``use_gpus``: a cluster that lost a node may lack,
    for now, what the plan needs (its GPUs, all of them on that node), and the restart waits
    for it to come back (``timeout_s``, ``--restart-wait-s``) instead of refusing the plan.
    """
    if use_gpus is None:
        use_gpus = _cluster_gpus() > 0
        _check_capacity(plan, use_gpus)
    realized = await _ray_call_in_thread(
        create_placement_groups, plan, use_gpus=use_gpus, timeout_s=timeout_s
    )
    stack.callback(realized.remove)
    return realized


# --- the services of a run -----------------------------------------------------------------------


@dataclass
class JudgeService:
    """The run's judge service as the run holds it: its URL and client, its engines (in the
    plan's bundles) and their sleepers. A restart in place keeps it (``rl_core.launch``), with
    the judges' phase states at the loss (asleep, in colocate's train phase)."""

    url: str
    client: AsyncGenRMClient
    engines: dict[str, list[RemoteEngine]]
    sleepers: dict[str, Sleeper]
    states: dict[str, State] = field(default_factory=dict)


@dataclass
class Services:
    """What the GRPO loop runs on: the engines, the trainer groups, the phase machine and the
    judge service (None without one)."""

    engines: list[RecoverableEngine]
    groups: dict[str, Any]
    phases: PhaseMachine
    judge_service: JudgeService | None = None

    @property
    def judge(self) -> AsyncGenRMClient | None:
        return self.judge_service.client if self.judge_service is not None else None

    @property
    def judge_engines(self) -> dict[str, list[RemoteEngine]]:
        return self.judge_service.engines if self.judge_service is not None else {}

    async def end_trainer_and_rollout(self) -> None:
        """End the trainer ranks and the rollout engines (a restart in place re-creates them in
        their bundles; the judge service and the placement groups stay)."""
        await asyncio.gather(
            *(g.kill() for g in self.groups.values()), *(e.kill() for e in self.engines)
        )


def loads_user_code(cfg: TrainConfig) -> bool:
    """Whether the run calls reward code of the user's (``--custom-rm-path``,
    ``--custom-reward-post-process-path``), which may find the judge through ``GENRM_URL``."""
    return bool(cfg.custom_rm_path or cfg.custom_reward_post_process_path)


async def _use_judge_service(
    cfg: TrainConfig, url: str, stack: AsyncExitStack, console: Console
) -> AsyncGenRMClient:
    """The judge client for the service at ``url``, closed last. rl-core's reward functions are
    handed it; a user's own reward code may instead call ``get_genrm_client()``, which reads
    ``GENRM_URL`` when it makes its client, so that is set for it (and any client made before
    this service existed is dropped)."""
    if loads_user_code(cfg):
        os.environ["GENRM_URL"] = url
    await close_genrm_clients()
    stack.push_async_callback(close_genrm_clients)
    console.print(f"[bold]judge service[/]: {url} ({', '.join(cfg.genrm_instances)})")
    return get_genrm_client(url)


async def start_services(
    cfg: TrainConfig,
    realized: RealizedPlacement,
    policy_path: str,
    rollout_engine: str,
    stack: AsyncExitStack,
    console: Console,
    clock: PhaseClock,
    startup: PhaseTimes,
    *,
    trainer: bool = True,
    judge: JudgeService | None = None,
    judge_stack: AsyncExitStack | None = None,
) -> Services:
    """Engines first, then the trainer: on a shared GPU each role loads within its share. What
    sits on disjoint GPUs starts at the same time (a start is mostly waiting on processes,
    imports and model loads); what shares a GPU starts one after another.

    ``trainer=False`` (``rl-core eval``): the engines and judges of the plan, in its bundles,
    and no trainer groups (``Services.groups`` is empty, the phases have no ``actor``).

    ``judge``: the judge service of this run's attempt before a restart in place, used as it
    is; else one is started (with the plan's judges), torn down by ``judge_stack`` (``stack``
    when not given) however the run ends.
    """
    plan = cfg.plan
    prefix = f"rl-core-{uuid.uuid4().hex[:6]}:"
    instances = judge_specs(cfg) if cfg.genrm_enabled else {}
    rollout = rollout_spec(cfg, policy_path, rollout_engine)
    steps: StartSteps = {"rollout_engines": start_rollout_engines(realized, rollout, prefix)}
    if instances and judge is None:
        steps["judge_service"] = start_judge_service(
            realized, instances, judge_stack or stack, cfg.genrm_port, name_prefix=prefix
        )
    if trainer and plan.phases_overlap:  # fully-async: the trainer's GPUs are its own
        steps["trainer"] = start_trainer_groups(cfg, realized, policy_path, prefix)
    if plan.shares_gpus("rollout", "genrm"):
        started = await start_in_turn(steps, clock, startup)
    else:
        started = await start_together(steps, clock, startup)
    engines: list[RecoverableEngine] = started["rollout_engines"]

    if instances and judge is None:
        url, judge_actors = started["judge_service"]
        judge = JudgeService(
            url=url,
            client=await _use_judge_service(cfg, url, judge_stack or stack, console),
            engines={
                key: [engine_actor(a, engine_id_for(key, i)) for i, a in enumerate(actors)]
                for key, actors in judge_actors.items()
            },
            sleepers={judge_id(k): JudgeSleeper(url, k) for k in instances},
        )
    participants: dict[str, Sleeper] = {"rollout": GroupSleeper(engines)}
    if judge is not None:
        participants.update(judge.sleepers)
    states = dict(judge.states) if judge is not None else {}
    phases = PhaseMachine(phases_from_plan(plan), participants, states=states)
    if not trainer:
        return Services(engines, {}, phases, judge)
    if plan.phases_overlap:
        groups = started["trainer"]
    else:
        # Colocated: the engines sharing the actor's GPUs sleep (as in the train phase)
        # before the trainer loads, so its weights never meet theirs at start-up.
        with clock.timed("engines_sleep", startup):
            await phases.enter("train")
        with clock.timed("trainer", startup):
            groups = await start_trainer_groups(cfg, realized, policy_path, prefix)
    learner = groups["actor"]
    phases.add("actor", CallbackSleeper(learner.offload, learner.onload))
    return Services(engines, groups, phases, judge)


async def shutdown_engines(engines: Sequence[RecoverableEngine]) -> None:
    """The rollout engines ended in order once the run is done with them. Removing the
    placement groups ends their actors too, but under load Ray may kill one outright before its
    exit hooks ran, and what an engine keeps outside its process goes only with an orderly end:
    a CPU engine's weight snapshot (512 MB for the embedded model) in the temp dir. A failure is
    a warning, not the run's: its result is saved by then."""
    done = await asyncio.gather(*(e.shutdown() for e in engines), return_exceptions=True)
    for engine, result in zip(engines, done, strict=True):
        if isinstance(result, Exception):
            logger.warning(
                "rollout engine %s did not shut down in order (its actor is killed instead): "
                "%s: %s",
                engine.name,
                type(result).__name__,
                result,
            )


async def start_weight_sync(
    cfg: TrainConfig,
    realized: RealizedPlacement,
    rollout_engine: str,
    services: Services,
    console: Console,
    clock: PhaseClock,
    startup: PhaseTimes,
) -> WeightSync:
    """The plan's weight path between the actor and the rollout engines, set up."""
    path = choose_weight_sync(
        cfg.plan, use_gpus=realized.use_gpus, device=cfg.device, engine=rollout_engine
    )
    sync = make_weight_sync(path, services.groups["actor"], services.engines, plan=cfg.plan)
    with clock.timed("weight_sync_setup", startup):
        await sync.setup()
    console.print(f"[bold]weight sync[/]: {path}")
    return sync
