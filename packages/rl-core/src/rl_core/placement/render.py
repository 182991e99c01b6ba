"""The plan as a text GPU map, in the spirit of the original document's diagrams.

One block per placement group, one row per role or judge instance per phase, one column per
bundle (= GPU, sorted by node and GPU id; ``|`` marks a node boundary). A user reads off which
GPUs rollout, each judge instance and the actor use in each phase, and with how much memory,
before anything is started.
"""

from __future__ import annotations

from rl_core.participants import is_judge, judge_key
from rl_core.placement.plan import (
    COLOCATE_GPU_SHARE,
    Activity,
    GroupPlan,
    PlacementPlan,
)

__all__ = ["MODE_SUMMARY", "render_plan"]

MODE_SUMMARY: dict[str, str] = {
    "colocate": "rollout on the actor's bundles, no judge; the actor takes back every GPU to train",
    "colocate-split": (
        "rollout and judges on disjoint bundles, in parallel; reward inline, per sample; "
        "the actor takes back every GPU to train"
    ),
    "colocate-shared": (
        "rollout and judges co-resident on the same bundles, memory split by "
        "mem_fraction_static; reward inline, per sample; the actor takes back every GPU to train"
    ),
    "colocate-defer-swap": (
        "rollout and judges take turns on the same bundles (sleep / wake); reward after the "
        "batch; the actor takes back every GPU to train"
    ),
    "fully-async": (
        "every role on its own GPUs and placement group; rollout and training run in parallel"
    ),
}

#: Grid columns are dropped (ranges only) above this many bundles in one group.
_MAX_GRID = 32
_WORKER_CELL = {"actor": "A", "reference": "ref", "actor_fwd": "fwd", "advantages": "adv"}


def _ranges(bundles: tuple[int, ...]) -> str:
    if not bundles:
        return "-"
    if len(bundles) == 1:
        return f"bundle {bundles[0]}"
    return f"bundles {bundles[0]}..{bundles[-1]}"


def _cells(plan: PlacementPlan, group: GroupPlan, act: Activity) -> list[str]:
    cells = ["."] * group.num_bundles
    if act.who == "rollout" or is_judge(act.who):
        instance = judge_key(act.who)
        role = "rollout" if instance is None else "genrm"
        for e in plan.engines_of(role, instance):
            for b in e.bundles:
                cells[b] = f"{role[0]}{e.index}"
    else:
        for b in act.bundles:
            cells[b] = _WORKER_CELL.get(act.who, act.who[:3])
    return cells


def _grid(cells: list[str], gpn: int, width: int) -> str:
    out = []
    for i, c in enumerate(cells):
        if i and i % gpn == 0:
            out.append("|")
        out.append(c.rjust(width))
    return " ".join(out)


def _mem(act: Activity) -> str:
    if act.who != "rollout" and not is_judge(act.who):
        return ""
    if act.mem_fraction_static is None:
        return "mem_fraction_static: engine default"
    return f"mem_fraction_static {act.mem_fraction_static:g}"


def _what(plan: PlacementPlan, act: Activity) -> str:
    if act.who == "rollout" or is_judge(act.who):
        instance = judge_key(act.who)
        engines = plan.engines_of("rollout" if instance is None else "genrm", instance)
        size = len(engines[0].bundles) if engines else 0
        return f"{len(engines)} engine{'s' * (len(engines) != 1)} × {size} GPU"
    return f"{len(act.bundles)} worker{'s' * (len(act.bundles) != 1)}"


def render_plan(plan: PlacementPlan) -> str:
    """A multi-line GPU map of ``plan`` (no trailing newline)."""
    lines = [f"mode: {plan.mode} — {MODE_SUMMARY[plan.mode]}"]
    nodes = -(-plan.num_gpus // plan.num_gpus_per_node)
    lines.append(
        f"GPUs: {plan.num_gpus} in {len(plan.groups)} placement group"
        f"{'s' * (len(plan.groups) != 1)} of {{GPU: 1, CPU: 1}} bundles (PACK); nodes of "
        f"{plan.num_gpus_per_node} GPUs (≥ {nodes} node{'s' * (nodes != 1)})"
    )
    if plan.judges:
        lines.append(
            "judges: "
            + ", ".join(
                f"{j.route_key} ({len(j.bundles)} GPU, {len(j.bundles) // j.num_gpus_per_engine}"
                f" × {j.num_gpus_per_engine}-GPU engine, engine={j.engine})"
                for j in plan.judges.values()
            )
            + f"; reward {plan.judging}"
            + (f", post-process hook: {plan.post_process}" if plan.post_process else "")
        )
    if plan.phases_overlap:
        lines.append("phases: inference and train run at the same time, each on its own GPUs")
    else:
        lines.append("phases, in order each step: " + " → ".join(p.name for p in plan.phases))

    for group in plan.groups:
        lines.append("")
        lines.append(
            f'placement group "{group.name}": {group.num_bundles} '
            f"bundle{'s' * (group.num_bundles != 1)} "
            f"(roles: {', '.join(group.roles)})"
        )
        acts = [(p.name, a) for p in plan.phases for a in p.activities if a.group == group.name]
        grid = group.num_bundles <= _MAX_GRID
        cell_rows = {id(a): _cells(plan, group, a) for _, a in acts}
        width = max([1, *(len(c) for cells in cell_rows.values() for c in cells)])
        width = max(width, len(str(group.num_bundles - 1)))
        who_w = max([5, *(len(a.who) for _, a in acts)])
        what_w = max([4, *(len(_what(plan, a)) for _, a in acts)])
        if grid:
            header = _grid(
                [str(i) for i in range(group.num_bundles)], plan.num_gpus_per_node, width
            )
            lines.append(f"  {'phase':<9}  {'who':<{who_w}}  {'':<{what_w}}  {header}")
        last_phase = None
        for phase, act in acts:
            label = phase if phase != last_phase else ""
            last_phase = phase
            head = f"  {label:<9}  {act.who:<{who_w}}  "
            if act.state == "asleep":
                lines.append(f"{head}{act.task}: {_ranges(act.bundles)}")
                continue
            what = _what(plan, act)
            body = (
                _grid(cell_rows[id(act)], plan.num_gpus_per_node, width)
                if grid
                else _ranges(act.bundles)
            )
            tail = "  ".join(x for x in (act.task, _mem(act)) if x)
            lines.append(f"{head}{what:<{what_w}}  {body}   {tail}")
    if plan.mode != "fully-async":
        shares = ", ".join(
            f"{role} {COLOCATE_GPU_SHARE[role]:g}"
            for role in plan.roles
            if role in COLOCATE_GPU_SHARE
        )
        lines.append("")
        lines.append(
            f"Ray GPU share per bundle: {shares} (a scheduling token; memory is set by "
            "mem_fraction_static and sleep / offload)"
        )
    for w in plan.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)
