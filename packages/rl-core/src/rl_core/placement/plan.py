"""The placement plan: users' GPU budgets turned into pure data, before any Ray or model starts.

Why pure data: a wrong layout must fail here, in milliseconds and with the arithmetic in the
message, not twenty minutes later as an out-of-memory error on the eighth GPU. The same plan is
then realised on Ray (``realize.py``), rendered as a GPU map (``render.py``) and read by the
trainer to know which phases to run.

Bundles are *logical*: bundle ``k`` of a placement group is the ``k``-th GPU after sorting the
group's bundles by (node, GPU id), so an engine's bundles are contiguous GPUs of one node. The plan
assumes each group starts at a node boundary (bundle ``k`` on node ``k // num_gpus_per_node``);
the realisation checks where bundles really landed.

Modes (SPEC.md §6), with ``A`` = actor GPUs, ``R`` = rollout GPUs, ``G`` = the judges' GPUs:

- ``colocate-split``: ``--colocate`` and ``R + G == A``; rollout on bundles ``0..R-1``, then each
  judge instance at its prefix offset; inference and judging in parallel, reward inline.
- ``colocate-shared``: ``--colocate`` and ``R == G == A``; both on every bundle, memory split by
  ``mem_fraction_static`` (both must be set, sum per GPU below 1.0; a warning above 0.9).
- ``colocate-defer-swap``: shared bundles plus ``--rm-type dummy``,
  ``--defer-reward-to-post-process`` and a post-process hook; rollout and judge take turns
  (≈0.85 of memory each), reward after the batch.
- ``fully-async``: every role on its own GPUs, in its own placement group.
- ``colocate``: ours, ``--colocate`` without any judge (a rule-based reward): rollout on the
  actor's bundles.

In every colocate mode the actor takes back every GPU for training.

Node sizes: an engine of at most ``num_gpus_per_node`` GPUs must sit on one node. A larger one
must be an engine that spans nodes (SGLang: rollout engines, and judge engines of kind ``sglang``
or ``auto``), take whole nodes and start at a node boundary; the embedded ``hf`` and ``scripted``
engines are one process and never span nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from genrm_serve import InstanceSpec
from rl_core.participants import judge_id
from rl_core.placement.errors import PlacementError

__all__ = [
    "BUILTIN_POST_PROCESS",
    "COLOCATE_GPU_SHARE",
    "DEFER_SWAP_MEM_FRACTION",
    "KNOWN_ROLES",
    "SHARED_MEM_WARN",
    "SPANNING_JUDGE_ENGINES",
    "Activity",
    "EnginePlacement",
    "GroupPlan",
    "JudgePlacement",
    "LayoutRequest",
    "Mode",
    "Phase",
    "PlacementPlan",
    "RolePlacement",
    "RoleResource",
    "plan_layout",
]

Mode = Literal[
    "colocate", "colocate-split", "colocate-shared", "colocate-defer-swap", "fully-async"
]

#: Roles ``--resource`` may name (the original's). ``advantages`` may have 0 GPUs (it runs on CPU).
KNOWN_ROLES: tuple[str, ...] = ("actor", "rollout", "genrm", "reference", "actor_fwd", "advantages")
_TRAIN_ROLES: tuple[str, ...] = ("actor", "reference", "actor_fwd")
_ZERO_GPU_ROLES = frozenset({"advantages"})

#: Memory fraction each engine may take in defer-swap when the flags leave it unset: they never
#: hold memory at the same time (SPEC.md §6, "≈0.85").
DEFER_SWAP_MEM_FRACTION = 0.85
#: Co-resident engines above this sum per GPU leave too little for CUDA graphs and activations.
SHARED_MEM_WARN = 0.9

#: Ray GPU (and CPU) share each role's actor asks of a *shared* colocate bundle. Ray's fraction is
#: only a scheduling token here (real memory is governed by ``mem_fraction_static`` and
#: sleep / offload); what matters is that every role that can meet on one bundle fits in it:
#: 0.4 + 0.1 + 0.1 + 0.2 + 0.2 = 1.0. Dedicated bundles (fully-async) use 1.0.
COLOCATE_GPU_SHARE: Mapping[str, float] = {
    "actor": 0.4,
    "reference": 0.1,
    "actor_fwd": 0.1,
    "rollout": 0.2,
    "genrm": 0.2,
}

#: Judge engine kinds that may span nodes (SGLang multi-node tensor parallelism; ``auto`` is
#: SGLang on a GPU machine). Rollout engines are SGLang on GPU and may span too.
SPANNING_JUDGE_ENGINES = frozenset({"auto", "sglang"})

#: ``--builtin-reward-post-process``: rl-core's own defer-swap hook (the training issue's).
BUILTIN_POST_PROCESS = "builtin"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RoleResource(_Frozen):
    """One ``--resource`` entry: ``[groups, gpus_per_group]``."""

    groups: int = Field(gt=0)
    gpus_per_group: int = Field(ge=0)

    @property
    def total(self) -> int:
        return self.groups * self.gpus_per_group

    def __str__(self) -> str:
        return f"[{self.groups}, {self.gpus_per_group}]"


class LayoutRequest(_Frozen):
    """Everything the plan depends on, already parsed (``args.layout_request_from_args``)."""

    resource: dict[str, RoleResource]
    colocate: bool = False
    fully_async: bool = False
    rollout_num_gpus: int | None = Field(default=None, gt=0)
    rollout_num_gpus_per_engine: int = Field(default=1, gt=0)
    #: the rollout engine kind: ``auto`` = SGLang where it is installed on a GPU machine, else hf.
    rollout_engine: Literal["auto", "hf", "sglang"] = "auto"
    rollout_mem_fraction_static: float | None = Field(default=None, gt=0.0, lt=1.0)
    #: SGLang server arguments of the rollout engines (``--sglang-config`` / ``--sglang-*``).
    rollout_server_args: dict[str, Any] = Field(default_factory=dict)
    genrm: dict[str, InstanceSpec] = Field(default_factory=dict)
    rm_type: str | None = None
    defer_reward_to_post_process: bool = False
    #: ``--custom-reward-post-process-path`` (``module.func``), or :data:`BUILTIN_POST_PROCESS`.
    reward_post_process: str | None = None
    num_gpus_per_node: int = Field(default=8, gt=0)


class RolePlacement(_Frozen):
    """A role's bundles: one worker per bundle, each asking ``gpu_fraction`` of it."""

    role: str
    group: str
    bundles: tuple[int, ...]
    num_groups: int
    gpus_per_group: int
    gpu_fraction: float


class JudgePlacement(_Frozen):
    """One judge instance (route_key) and the bundles its engines share out."""

    route_key: str
    group: str
    bundles: tuple[int, ...]
    num_gpus_per_engine: int
    engine: str
    mem_fraction_static: float | None


class EnginePlacement(_Frozen):
    """One inference engine: its actor sits in ``bundles[0]``; it drives all of ``bundles``."""

    role: Literal["rollout", "genrm"]
    instance: str | None
    index: int
    group: str
    bundles: tuple[int, ...]
    mem_fraction_static: float | None
    gpu_fraction: float
    may_span_nodes: bool

    @property
    def name(self) -> str:
        if self.instance is None:
            return f"{self.role}-{self.index}"
        return f"{self.role}-{self.instance}-{self.index}"


class Activity(_Frozen):
    """What one role (or judge instance) does on its bundles during a phase."""

    who: str
    group: str
    bundles: tuple[int, ...]
    state: Literal["active", "asleep"]
    task: str
    mem_fraction_static: float | None = None


class Phase(_Frozen):
    name: Literal["inference", "reward", "train"]
    activities: tuple[Activity, ...]


class GroupPlan(_Frozen):
    """A placement group of ``num_bundles`` ``{GPU: 1, CPU: 1}`` bundles (PACK)."""

    name: str
    num_bundles: int
    roles: tuple[str, ...]


class PlacementPlan(_Frozen):
    """The whole layout: pure data, JSON-serialisable (``model_dump(mode="json")``)."""

    mode: Mode
    num_gpus: int
    num_gpus_per_node: int
    groups: tuple[GroupPlan, ...]
    roles: dict[str, RolePlacement]
    judges: dict[str, JudgePlacement]
    engines: tuple[EnginePlacement, ...]
    phases: tuple[Phase, ...]
    #: fully-async: inference and training run at the same time on their own GPUs.
    phases_overlap: bool
    #: How judges score: inline per sample, deferred to after the batch, or no judge at all.
    judging: Literal["inline", "deferred", "none"]
    post_process: str | None
    warnings: tuple[str, ...]

    def group(self, name: str) -> GroupPlan:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"no placement group {name!r} in the plan ({[g.name for g in self.groups]})")

    def sleeps(self, who: str) -> bool:
        """Whether ``who`` (``rollout``, ``genrm:<route_key>``, ``actor``...) is asleep in some
        phase: its engines then keep host buffers for their weights from the start."""
        return any(
            a.who == who and a.state == "asleep" for ph in self.phases for a in ph.activities
        )

    def engines_of(self, role: str, instance: str | None = None) -> tuple[EnginePlacement, ...]:
        return tuple(e for e in self.engines if e.role == role and e.instance == instance)

    def shares_gpus(self, a: str, b: str) -> bool:
        """Whether roles ``a`` and ``b`` (``actor``, ``rollout``, ``genrm``...) hold a bundle in
        common: engines on disjoint GPUs may start at the same time, ones sharing a GPU one after
        another (each sizes its memory from what is free when it starts)."""
        ra, rb = self.roles.get(a), self.roles.get(b)
        if ra is None or rb is None or ra.group != rb.group:
            return False
        return not set(ra.bundles).isdisjoint(rb.bundles)

    def node_of(self, bundle: int) -> int:
        """The node ordinal the plan expects a group's logical bundle on."""
        return bundle // self.num_gpus_per_node


def _span(start: int, n: int) -> tuple[int, ...]:
    return tuple(range(start, start + n))


def _fmt(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".") if x != int(x) else f"{x:.1f}"


def _instances_sum(genrm: Mapping[str, InstanceSpec]) -> str:
    parts = [f"{k} {s.num_gpus}" for k, s in genrm.items()]
    total = sum(s.num_gpus for s in genrm.values())
    return " + ".join(parts) + (f" = {total}" if len(parts) > 1 else "")


def _check_resource(req: LayoutRequest) -> None:
    unknown = sorted(set(req.resource) - set(KNOWN_ROLES))
    if unknown:
        raise PlacementError(
            f"--resource: unknown role(s) {unknown}; known roles: {', '.join(KNOWN_ROLES)}"
        )
    if "actor" not in req.resource:
        raise PlacementError(
            '--resource: missing the "actor" entry (the training GPUs), e.g. '
            '\'{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 4]}\''
        )
    for role, res in req.resource.items():
        if res.gpus_per_group == 0 and role not in _ZERO_GPU_ROLES:
            raise PlacementError(
                f"--resource: {role} {res} has 0 GPUs per group; only "
                f"{', '.join(sorted(_ZERO_GPU_ROLES))} may run without GPUs (leave the role out "
                "instead if it is not used)"
            )


def _resolve_rollout(req: LayoutRequest, actor: int) -> int:
    res = req.resource.get("rollout")
    flag = req.rollout_num_gpus
    if res is not None and flag is not None and res.total != flag:
        raise PlacementError(
            f"--rollout-num-gpus {flag} ≠ --resource rollout {res} = {res.total}: give one of "
            "them, or make them equal"
        )
    if res is not None:
        return res.total
    if flag is not None:
        return flag
    if req.fully_async:
        raise PlacementError(
            '--fully-async: --resource needs a "rollout" entry (its own GPUs), e.g. '
            '"rollout": [1, 3]'
        )
    return actor  # --colocate: rollout takes the actor's GPUs unless told otherwise


def _resolve_genrm(req: LayoutRequest) -> int:
    res = req.resource.get("genrm")
    total = sum(s.num_gpus for s in req.genrm.values())
    if req.genrm and res is None:
        raise PlacementError(
            f"GenRM is configured (instances: {_instances_sum(req.genrm)} GPUs) but --resource "
            f'has no "genrm" entry: add "genrm": [1, {total}]'
        )
    if res is not None and not req.genrm:
        raise PlacementError(
            f"--resource gives genrm {res} = {res.total} GPUs but no judge is configured: set "
            "--genrm-model-path or --genrm-instances, or drop the genrm entry"
        )
    if res is not None and res.total != total:
        raise PlacementError(
            f"genrm instances need {_instances_sum(req.genrm)} GPUs ≠ --resource genrm {res} = "
            f"{res.total}: the genrm entry must equal the sum of the instances' num_gpus"
        )
    for key, spec in req.genrm.items():
        if spec.num_gpus % spec.num_gpus_per_engine:
            raise PlacementError(
                f"genrm instance {key!r}: num_gpus={spec.num_gpus} is not a multiple of "
                f"num_gpus_per_engine={spec.num_gpus_per_engine}"
            )
    return total


#: Engine kinds that run in one process on one device (transformers): one GPU per engine.
ONE_DEVICE_ENGINES = frozenset({"hf"})


def _check_one_device_engines(req: LayoutRequest) -> None:
    if req.rollout_engine in ONE_DEVICE_ENGINES and req.rollout_num_gpus_per_engine > 1:
        raise PlacementError(
            f"--rollout-num-gpus-per-engine {req.rollout_num_gpus_per_engine} with "
            f"--rollout-engine {req.rollout_engine}: the {req.rollout_engine} engine runs on one "
            "device, so each engine takes 1 GPU (more GPUs = more engines); use "
            "--rollout-engine sglang for tensor-parallel engines"
        )
    for key, spec in req.genrm.items():
        if spec.engine in ONE_DEVICE_ENGINES and spec.num_gpus_per_engine > 1:
            raise PlacementError(
                f"genrm instance {key!r}: num_gpus_per_engine={spec.num_gpus_per_engine} with "
                f"engine={spec.engine}: the {spec.engine} engine runs on one device, so each "
                "engine takes 1 GPU (num_gpus = the number of engines); use engine=sglang for "
                "tensor-parallel judges"
            )


def _valid_colocate_layouts(actor: int, genrm: int) -> str:
    lines = [f"valid --colocate layouts for actor {actor}:"]
    if genrm and genrm < actor:
        lines.append(
            f'  split:  rollout + genrm = {actor}, here "rollout": [1, {actor - genrm}] with '
            f"genrm {genrm}"
        )
    else:
        lines.append(
            f'  split:  rollout + genrm = {actor}, e.g. "rollout": [1, {actor // 2}], '
            f'"genrm": [1, {actor - actor // 2}]'
        )
    lines.append(
        f'  shared: rollout = genrm = {actor}, i.e. "rollout": [1, {actor}], "genrm": [1, {actor}] '
        "(co-resident with both mem_fraction_static set, or defer-swap)"
    )
    lines.append("  or --fully-async: every role on its own GPUs")
    return "\n".join(lines)


def _check_engine_nodes(
    label: str, bundles: tuple[int, ...], gpn: int, can_span: bool, why_not: str
) -> None:
    start, size = bundles[0], len(bundles)
    end = bundles[-1]
    if size <= gpn:
        if start // gpn != end // gpn:
            boundary = (start // gpn + 1) * gpn
            raise PlacementError(
                f"{label} would take bundles {start}..{end}, across the node boundary at bundle "
                f"{boundary} (--num-gpus-per-node {gpn}): an engine must sit on one node; choose "
                f"GPU counts so that every engine starts and ends inside a node (e.g. engine "
                f"sizes dividing {gpn} and role sizes that are multiples of them)"
            )
        return
    if not can_span:
        raise PlacementError(
            f"{label} needs {size} GPUs, more than a node (--num-gpus-per-node {gpn}), and "
            f"{why_not}: use at most {gpn} GPUs per engine, or an SGLang engine"
        )
    if size % gpn or start % gpn:
        raise PlacementError(
            f"{label} spans nodes with {size} GPUs from bundle {start}: an engine across nodes "
            f"must take whole nodes ({gpn}, {2 * gpn}, ... GPUs) starting at a node boundary"
        )


def _mem_checks(req: LayoutRequest, mode: Mode) -> tuple[dict[str, float | None], list[str]]:
    """Memory fraction per engine group ("rollout", route keys) and warnings; raises when bad."""
    fracs: dict[str, float | None] = {"rollout": req.rollout_mem_fraction_static}
    for key, spec in req.genrm.items():
        fracs[key] = spec.engine_config.mem_fraction_static
    warnings: list[str] = []
    if mode == "colocate-defer-swap":
        return {k: DEFER_SWAP_MEM_FRACTION if v is None else v for k, v in fracs.items()}, warnings
    if mode != "colocate-shared":
        return fracs, warnings
    missing = []
    if fracs["rollout"] is None:
        missing.append("rollout: --sglang-mem-fraction-static")
    missing += [
        f"genrm {k!r}: mem_fraction_static in --genrm-engine-config (or the instance's "
        "engine_config)"
        for k in req.genrm
        if fracs[k] is None
    ]
    if missing:
        raise PlacementError(
            "colocate-shared (co-resident): rollout and judge engines live on the same GPUs, so "
            "both mem_fraction_static values must be set, summing below 1.0 per GPU (≤ 0.9 "
            "recommended, e.g. rollout 0.6 + genrm 0.3); missing: " + "; ".join(missing)
        )
    rollout = fracs["rollout"]
    assert rollout is not None
    for key in req.genrm:
        judge = fracs[key]
        assert judge is not None
        total = round(rollout + judge, 6)
        arith = f"rollout {_fmt(rollout)} + genrm {key!r} {_fmt(judge)} = {_fmt(total)} per GPU"
        if total >= 1.0:
            raise PlacementError(
                f"colocate-shared (co-resident): {arith} ≥ 1.0: lower one or both "
                "mem_fraction_static values (≤ 0.9 in total recommended, e.g. 0.6 + 0.3)"
            )
        if total > SHARED_MEM_WARN:
            warnings.append(
                f"colocate-shared: {arith} > {SHARED_MEM_WARN}: little room is left for CUDA "
                "graphs and activations; ≤ 0.9 is recommended"
            )
    return fracs, warnings


def _decide_colocate(req: LayoutRequest, actor: int, rollout: int, genrm: int) -> Mode:
    for role in ("reference", "actor_fwd"):
        res = req.resource.get(role)
        if res is not None and res.total != actor:
            raise PlacementError(
                f"--colocate: {role} {res} = {res.total} ≠ actor {actor}: in colocate mode "
                f'{role} runs on the actor\'s GPUs; set "{role}": [1, {actor}] or leave it out'
            )
    adv = req.resource.get("advantages")
    if adv is not None and adv.total not in (0, actor):
        raise PlacementError(
            f"--colocate: advantages {adv} = {adv.total} GPUs: use 0 (CPU) or the actor's {actor}"
        )
    if genrm == 0:
        if rollout != actor:
            raise PlacementError(
                f"--colocate without a judge: rollout {rollout} ≠ actor {actor}: rollout shares "
                f'the actor\'s GPUs; set "rollout": [1, {actor}] (or use --fully-async for '
                "separate GPUs)"
            )
        return "colocate"
    if rollout + genrm == actor:
        return "colocate-split"
    if rollout == genrm == actor:
        return "colocate-shared"
    raise PlacementError(
        f"--colocate: rollout {rollout} + genrm {genrm} = {rollout + genrm} ≠ actor {actor} "
        f"(not split), and not rollout = genrm = actor (not shared: {rollout}, {genrm}, "
        f"{actor}); other layouts are rejected.\n" + _valid_colocate_layouts(actor, genrm)
    )


def _check_defer(req: LayoutRequest, mode: Mode) -> Mode:
    """Turn shared into defer-swap when the defer flags ask for it; reject half-set flags."""
    if not req.defer_reward_to_post_process:
        return mode
    if mode != "colocate-shared":
        raise PlacementError(
            f"--defer-reward-to-post-process with {mode} (the judge's own GPUs, always awake): "
            "defer-swap needs shared bundles (rollout = genrm = actor) so that rollout and judge "
            "can take turns; in this layout drop the defer flags and score inline (e.g. "
            "--rm-type dapo-genrm)"
        )
    if req.rm_type != "dummy":
        raise PlacementError(
            f"colocate-defer-swap needs --rm-type dummy (got --rm-type {req.rm_type}): during "
            "rollout the judge is asleep, so an inline reward cannot call it"
        )
    if not req.reward_post_process:
        raise PlacementError(
            "colocate-defer-swap needs a post-process hook that swaps rollout and judge and "
            "scores the batch: give --custom-reward-post-process-path module.func, or "
            "--builtin-reward-post-process for rl-core's own"
        )
    return "colocate-defer-swap"


def _phases(
    mode: Mode,
    roles: Mapping[str, RolePlacement],
    judges: Mapping[str, JudgePlacement],
    rollout_frac: float | None,
) -> tuple[Phase, ...]:
    def act(
        who: str,
        group: str,
        bundles: tuple[int, ...],
        state: Literal["active", "asleep"],
        task: str,
        mem: float | None = None,
    ) -> Activity:
        return Activity(
            who=who, group=group, bundles=bundles, state=state, task=task, mem_fraction_static=mem
        )

    ro = roles["rollout"]
    train = [r for name, r in roles.items() if name in _TRAIN_ROLES]

    def rollout(state: Literal["active", "asleep"], mem: bool = True) -> Activity:
        task = "generate" if state == "active" else "asleep (memory released)"
        return act("rollout", ro.group, ro.bundles, state, task, rollout_frac if mem else None)

    def judge(j: JudgePlacement, state: Literal["active", "asleep"], task: str) -> Activity:
        mem = j.mem_fraction_static if state == "active" else None
        return act(judge_id(j.route_key), j.group, j.bundles, state, task, mem)

    def trainers(state: Literal["active", "asleep"]) -> list[Activity]:
        task = {
            "actor": "train",
            "reference": "reference log-probs",
            "actor_fwd": "old-policy log-probs",
        }
        return [
            act(
                r.role,
                r.group,
                r.bundles,
                state,
                task[r.role] if state == "active" else "offloaded",
            )
            for r in train
        ]

    asleep: Literal["asleep"] = "asleep"
    active: Literal["active"] = "active"
    if mode == "fully-async":
        inference = [rollout(active)] + [
            judge(j, active, "judge (inline, per sample)") for j in judges.values()
        ]
        return (
            Phase(name="inference", activities=tuple(inference)),
            Phase(name="train", activities=tuple(trainers(active))),
        )
    if mode == "colocate-defer-swap":
        return (
            Phase(
                name="inference",
                activities=(
                    rollout(active),
                    *(judge(j, asleep, "asleep (memory released)") for j in judges.values()),
                    *trainers(asleep),
                ),
            ),
            Phase(
                name="reward",
                activities=(
                    rollout(asleep, mem=False),
                    *(judge(j, active, "judge the batch") for j in judges.values()),
                    *trainers(asleep),
                ),
            ),
            Phase(
                name="train",
                activities=(
                    *trainers(active),
                    rollout(asleep, mem=False),
                    *(judge(j, asleep, "asleep (memory released)") for j in judges.values()),
                ),
            ),
        )
    inference = (
        [rollout(active)]
        + [judge(j, active, "judge (inline, per sample)") for j in judges.values()]
        + trainers(asleep)
    )
    train_phase = [*trainers(active), rollout(asleep, mem=False)] + [
        judge(j, asleep, "asleep (memory released)") for j in judges.values()
    ]
    return (
        Phase(name="inference", activities=tuple(inference)),
        Phase(name="train", activities=tuple(train_phase)),
    )


def _check_request(req: LayoutRequest) -> tuple[int, int, int]:
    """The checks that need no mode; the actor's, rollout's and judges' GPU counts."""
    if req.colocate == req.fully_async:
        raise PlacementError(
            "choose exactly one of --colocate (all roles in one placement group, the actor takes "
            "back every GPU to train; recommended) and --fully-async (every role on its own GPUs)"
            + (" — both were given" if req.colocate else "")
        )
    _check_resource(req)
    actor = req.resource["actor"].total
    rollout = _resolve_rollout(req, actor)
    genrm = _resolve_genrm(req)
    per_engine = req.rollout_num_gpus_per_engine
    if rollout % per_engine:
        raise PlacementError(
            f"rollout: {rollout} GPUs is not a multiple of --rollout-num-gpus-per-engine "
            f"{per_engine} ({rollout} / {per_engine} = {rollout / per_engine:g} engines)"
        )
    _check_one_device_engines(req)
    if req.rm_type == "dapo-genrm" and not req.genrm:
        raise PlacementError(
            "--rm-type dapo-genrm needs a judge: set --genrm-model-path (with a genrm entry in "
            "--resource) or --genrm-instances"
        )
    return actor, rollout, genrm


def _decide_mode(req: LayoutRequest, actor: int, rollout: int, genrm: int) -> Mode:
    if req.colocate:
        return _check_defer(req, _decide_colocate(req, actor, rollout, genrm))
    if req.defer_reward_to_post_process:
        raise PlacementError(
            "--defer-reward-to-post-process with --fully-async: the judge has its own GPUs "
            "and is always awake, so there is nothing to swap; drop the defer flags and "
            "score inline (defer-swap needs --colocate with rollout = genrm = actor)"
        )
    return "fully-async"


@dataclass(frozen=True)
class _Where:
    """Where a role goes in a mode: one ``colocate`` group at the role's GPU share, or a group of
    its own with whole GPUs (fully-async)."""

    colocated: bool

    def share(self, role: str) -> float:
        return COLOCATE_GPU_SHARE[role] if self.colocated else 1.0

    def group(self, role: str) -> str:
        return "colocate" if self.colocated else role

    def role(self, role: str, res: RoleResource, start: int, gpus: int) -> RolePlacement:
        return RolePlacement(
            role=role,
            group=self.group(role),
            bundles=_span(start, gpus),
            num_groups=res.groups,
            gpus_per_group=res.gpus_per_group,
            gpu_fraction=self.share(role),
        )


def _rollout_engines(
    req: LayoutRequest, rollout: int, frac: float | None, where: _Where
) -> list[EnginePlacement]:
    per_engine = req.rollout_num_gpus_per_engine
    engines = []
    for i in range(rollout // per_engine):
        bundles = _span(i * per_engine, per_engine)
        _check_engine_nodes(f"rollout engine {i}", bundles, req.num_gpus_per_node, True, "")
        engines.append(
            EnginePlacement(
                role="rollout",
                instance=None,
                index=i,
                group=where.group("rollout"),
                bundles=bundles,
                mem_fraction_static=frac,
                gpu_fraction=where.share("rollout"),
                may_span_nodes=True,
            )
        )
    return engines


def _judges(
    req: LayoutRequest, offset: int, fracs: dict[str, float | None], where: _Where
) -> tuple[dict[str, JudgePlacement], list[EnginePlacement]]:
    """Each judge instance's bundles from ``offset`` on, one after another, and its engines."""
    judges: dict[str, JudgePlacement] = {}
    engines: list[EnginePlacement] = []
    for key, spec in req.genrm.items():
        judges[key] = JudgePlacement(
            route_key=key,
            group=where.group("genrm"),
            bundles=_span(offset, spec.num_gpus),
            num_gpus_per_engine=spec.num_gpus_per_engine,
            engine=spec.engine,
            mem_fraction_static=fracs[key],
        )
        can_span = spec.engine in SPANNING_JUDGE_ENGINES
        for i in range(spec.num_gpus // spec.num_gpus_per_engine):
            bundles = _span(offset + i * spec.num_gpus_per_engine, spec.num_gpus_per_engine)
            _check_engine_nodes(
                f"genrm instance {key!r} engine {i} (engine={spec.engine})",
                bundles,
                req.num_gpus_per_node,
                can_span,
                f"engine={spec.engine} runs in one process and cannot span nodes",
            )
            engines.append(
                EnginePlacement(
                    role="genrm",
                    instance=key,
                    index=i,
                    group=where.group("genrm"),
                    bundles=bundles,
                    mem_fraction_static=fracs[key],
                    gpu_fraction=where.share("genrm"),
                    may_span_nodes=can_span,
                )
            )
        offset += spec.num_gpus
    return judges, engines


def plan_layout(req: LayoutRequest) -> PlacementPlan:
    """Decide the mode and every role's and engine's bundles; raise PlacementError if invalid."""
    actor, rollout, genrm = _check_request(req)
    mode = _decide_mode(req, actor, rollout, genrm)
    fracs, warnings = _mem_checks(req, mode)
    where = _Where(colocated=mode != "fully-async")

    # Training-side roles: in colocate they all sit on the actor's bundles.
    roles: dict[str, RolePlacement] = {
        role: where.role(role, res, 0, res.total)
        for role in _TRAIN_ROLES
        if (res := req.resource.get(role)) is not None
    }
    rollout_res = req.resource.get("rollout") or RoleResource(groups=1, gpus_per_group=rollout)
    roles["rollout"] = where.role("rollout", rollout_res, 0, rollout)
    engines = _rollout_engines(req, rollout, fracs["rollout"], where)
    judges: dict[str, JudgePlacement] = {}
    if req.genrm:
        # split: judges after the rollout's bundles; shared / own group: from bundle 0.
        offset = rollout if mode == "colocate-split" else 0
        roles["genrm"] = where.role("genrm", req.resource["genrm"], offset, genrm)
        judges, judge_engines = _judges(req, offset, fracs, where)
        engines += judge_engines
    adv = req.resource.get("advantages")
    if adv is not None and adv.total and not where.colocated:
        roles["advantages"] = where.role("advantages", adv, 0, adv.total)

    if where.colocated:
        groups = [GroupPlan(name="colocate", num_bundles=actor, roles=tuple(roles))]
    else:
        groups = [
            GroupPlan(name=n, num_bundles=len(r.bundles), roles=(n,)) for n, r in roles.items()
        ]
    train_roles = {k: v for k, v in roles.items() if k in (*_TRAIN_ROLES, "rollout")}
    judging: Literal["inline", "deferred", "none"] = (
        "deferred" if mode == "colocate-defer-swap" else "inline" if req.genrm else "none"
    )
    return PlacementPlan(
        mode=mode,
        num_gpus=actor if where.colocated else sum(g.num_bundles for g in groups),
        num_gpus_per_node=req.num_gpus_per_node,
        groups=tuple(groups),
        roles=roles,
        judges=judges,
        engines=tuple(engines),
        phases=_phases(mode, train_roles, judges, fracs["rollout"]),
        phases_overlap=mode == "fully-async",
        judging=judging,
        post_process=req.reward_post_process if mode == "colocate-defer-swap" else None,
        warnings=tuple(warnings),
    )
