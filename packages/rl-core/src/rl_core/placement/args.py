"""The placement flags, shared by ``rl-core plan`` and ``rl-core train`` so both read one layout.

The names are the original's (``--resource``, ``--colocate``, ``--rm-type``, ...), so its scripts
translate one to one. The GenRM flags come from genrm-serve's own parser; the only thing added here
is that a legacy judge's ``--genrm-num-gpus`` defaults to the ``genrm`` entry of ``--resource``
(the original's scripts give only the latter).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any, get_args

from genrm_serve import (
    GenRMConfigError,
    InstanceSpec,
    add_genrm_args,
    instances_from_args,
    invalid_json,
)
from rl_core.placement.errors import PlacementError
from rl_core.placement.plan import (
    BUILTIN_POST_PROCESS,
    KNOWN_ROLES,
    LayoutRequest,
    PlacementPlan,
    RoleResource,
    plan_layout,
)
from rl_core.placement.sglang_flags import rollout_server_args

__all__ = [
    "add_placement_args",
    "check_reward_mode",
    "default_resource",
    "judge_instances",
    "judge_num_gpus",
    "layout_from_args",
    "layout_request_from_args",
    "parse_resource",
    "plan_from_args",
]

_RESOURCE_EXAMPLE = '\'{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 4]}\''


def _default(field: str) -> Any:
    """A placement flag's default is its LayoutRequest field's (written once, there)."""
    return LayoutRequest.model_fields[field].get_default(call_default_factory=True)


def add_placement_args(parser: argparse.ArgumentParser, *, genrm: bool = True) -> None:
    """Add ``--resource``, the mode flags, the reward-mode flags and (``genrm``) the GenRM flags.

    Flags: ``--resource``, ``--colocate``, ``--fully-async``, ``--rollout-num-gpus``,
    ``--rollout-num-gpus-per-engine``, ``--sglang-mem-fraction-static``, ``--num-gpus-per-node``,
    ``--rm-type``, ``--defer-reward-to-post-process``, ``--custom-reward-post-process-path``,
    ``--builtin-reward-post-process``; with ``genrm`` also genrm-serve's ``--genrm-*`` flags, with
    ``--genrm-num-gpus`` defaulting to None (= the ``genrm`` entry of ``--resource``).
    """
    g = parser.add_argument_group("placement")
    g.add_argument(
        "--resource",
        default=None,
        help="JSON {role: [groups, gpus_per_group]}; roles: "
        + ", ".join(KNOWN_ROLES)
        + f"; e.g. {_RESOURCE_EXAMPLE}",
    )
    g.add_argument(
        "--colocate",
        action="store_true",
        help="all roles in one placement group; the actor takes back every GPU to train",
    )
    g.add_argument(
        "--fully-async", action="store_true", help="every role on its own GPUs, in parallel"
    )
    g.add_argument(
        "--rollout-num-gpus",
        type=int,
        default=_default("rollout_num_gpus"),
        help="rollout GPUs (= --resource rollout)",
    )
    g.add_argument(
        "--rollout-num-gpus-per-engine",
        type=int,
        default=_default("rollout_num_gpus_per_engine"),
        help="GPUs per rollout engine (TP)",
    )
    g.add_argument(
        "--rollout-engine",
        choices=get_args(LayoutRequest.model_fields["rollout_engine"].annotation),
        default=_default("rollout_engine"),
        help="rollout engine kind (auto: SGLang on a GPU machine where installed, else hf)",
    )
    g.add_argument(
        "--sglang-mem-fraction-static",
        type=float,
        default=_default("rollout_mem_fraction_static"),
        help="rollout engines' memory fraction per GPU (required in colocate-shared)",
    )
    g.add_argument(
        "--sglang-config",
        default=None,
        help="YAML / JSON mapping of SGLang server arguments for the rollout engines; "
        "--sglang-KEY VALUE overrides one (e.g. --sglang-attention-backend triton)",
    )
    g.add_argument(
        "--num-gpus-per-node",
        type=int,
        default=_default("num_gpus_per_node"),
        help="GPUs per node, for plan-time checks that an engine fits a node",
    )
    r = parser.add_argument_group("reward mode")
    r.add_argument("--rm-type", default=None, help="reward type, e.g. dapo-genrm, or dummy")
    r.add_argument(
        "--defer-reward-to-post-process",
        action="store_true",
        help="score the whole batch after rollout (defer-swap with --rm-type dummy)",
    )
    r.add_argument(
        "--custom-reward-post-process-path",
        default=None,
        help="module.func of the post-process hook that scores the deferred batch",
    )
    r.add_argument(
        "--builtin-reward-post-process",
        action="store_true",
        help="use rl-core's built-in defer-swap hook (rollout sleeps, judge wakes, batch scored)",
    )
    if genrm:
        add_genrm_args(parser)
        parser.set_defaults(genrm_num_gpus=None)


def _int(role: str, what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlacementError(
            f"--resource: {role!r}: {what}={value!r} must be an integer "
            "(entries are [groups, gpus_per_group])"
        )
    return value


def parse_resource(value: str | Mapping[str, Any] | None) -> dict[str, RoleResource]:
    """Parse ``--resource`` JSON into ``{role: RoleResource}``; errors name role, value, rule."""
    if value is None:
        raise PlacementError(f"--resource is required, e.g. --resource {_RESOURCE_EXAMPLE}")
    if isinstance(value, Mapping):
        raw: Any = dict(value)
    else:
        try:
            raw = json.loads(value)
        except json.JSONDecodeError as err:
            raise PlacementError(
                f"--resource: {invalid_json(err)}; value was {value!r}; "
                f"expected e.g. {_RESOURCE_EXAMPLE}"
            ) from None
    if not isinstance(raw, dict):
        raise PlacementError(
            f"--resource: must be a JSON object {{role: [groups, gpus_per_group]}}, got "
            f"{type(raw).__name__}: {value!r}"
        )
    unknown = sorted(set(raw) - set(KNOWN_ROLES))
    if unknown:
        raise PlacementError(
            f"--resource: unknown role(s) {unknown}; known roles: {', '.join(KNOWN_ROLES)}"
        )
    out: dict[str, RoleResource] = {}
    for role, entry in raw.items():
        if not isinstance(entry, list | tuple) or len(entry) != 2:
            raise PlacementError(
                f"--resource: {role!r}: expected [groups, gpus_per_group] (two integers), got "
                f"{json.dumps(entry)}"
            )
        groups = _int(role, "groups", entry[0])
        gpus = _int(role, "gpus_per_group", entry[1])
        if groups <= 0:
            raise PlacementError(
                f"--resource: {role!r}: groups={groups} must be a positive integer"
            )
        if gpus < 0:
            raise PlacementError(
                f"--resource: {role!r}: gpus_per_group={gpus} must not be negative"
            )
        out[role] = RoleResource(groups=groups, gpus_per_group=gpus)
    return out


def judge_num_gpus(resource: Mapping[str, RoleResource] | None) -> int:
    """A legacy judge's GPUs when ``--genrm-num-gpus`` is not given: the ``genrm`` entry of
    ``--resource`` (groups × GPUs), else 1. The one rule, for ``plan`` and ``train``."""
    genrm = (resource or {}).get("genrm")
    return genrm.total if genrm is not None and genrm.total > 0 else 1


def judge_instances(
    args: argparse.Namespace, resource: Mapping[str, RoleResource] | None
) -> dict[str, InstanceSpec]:
    """The judges the ``--genrm-*`` flags name (none without ``--genrm-model-path`` or
    ``--genrm-instances``), built once from the parsed ``--resource``."""
    num_gpus = getattr(args, "genrm_num_gpus", None)
    if num_gpus is None:
        num_gpus = judge_num_gpus(resource)
    try:
        return instances_from_args(args, num_gpus=num_gpus)
    except GenRMConfigError as err:
        raise PlacementError(str(err)) from err


def check_reward_mode(rm_type: str | None, defer: bool) -> None:
    """``--rm-type dummy`` without ``--defer-reward-to-post-process``: refused before the layout,
    which would accept it (a deferred reward with nothing to score it). Defer with another
    ``--rm-type`` is the plan's to refuse, in the words of the layout at hand."""
    if rm_type == "dummy" and not defer:
        raise PlacementError(
            "--rm-type dummy gives every sample a deferred placeholder; it needs "
            "--defer-reward-to-post-process (otherwise nothing would ever score the batch)"
        )


def layout_request_from_args(
    args: argparse.Namespace,
    *,
    resource: Mapping[str, RoleResource] | None = None,
    genrm: Mapping[str, InstanceSpec] | None = None,
    colocate: bool | None = None,
    sglang_overrides: Mapping[str, Any] | None = None,
) -> LayoutRequest:
    """Collect the flags of :func:`add_placement_args` into a :class:`LayoutRequest`.

    What the caller has already parsed or decided is passed in and not read from the flags
    again: ``resource`` (``--resource``), ``genrm`` (the judges), ``colocate`` (the mode when no
    mode flag was given), ``sglang_overrides`` (``--sglang-KEY VALUE``).
    """
    check_reward_mode(args.rm_type, args.defer_reward_to_post_process)
    resource = parse_resource(args.resource) if resource is None else resource
    post = args.custom_reward_post_process_path
    if post and args.builtin_reward_post_process:
        raise PlacementError(
            f"give either --custom-reward-post-process-path ({post}) or "
            "--builtin-reward-post-process, not both"
        )
    if args.builtin_reward_post_process:
        post = BUILTIN_POST_PROCESS
    for flag, value in (
        ("--rollout-num-gpus", args.rollout_num_gpus),
        ("--rollout-num-gpus-per-engine", args.rollout_num_gpus_per_engine),
        ("--num-gpus-per-node", args.num_gpus_per_node),
    ):
        if value is not None and value <= 0:
            raise PlacementError(f"{flag} {value}: must be a positive integer")
    frac = args.sglang_mem_fraction_static
    if frac is not None and not 0.0 < frac < 1.0:
        raise PlacementError(
            f"--sglang-mem-fraction-static {frac}: must be between 0 and 1 (exclusive)"
        )
    return LayoutRequest(
        rollout_server_args=rollout_server_args(
            args.sglang_config, dict(sglang_overrides) if sglang_overrides else None
        ),
        resource=dict(resource),
        colocate=args.colocate if colocate is None else colocate,
        fully_async=args.fully_async,
        rollout_num_gpus=args.rollout_num_gpus,
        rollout_num_gpus_per_engine=args.rollout_num_gpus_per_engine,
        rollout_engine=getattr(args, "rollout_engine", _default("rollout_engine")),
        rollout_mem_fraction_static=frac,
        genrm=judge_instances(args, resource) if genrm is None else dict(genrm),
        rm_type=args.rm_type,
        defer_reward_to_post_process=args.defer_reward_to_post_process,
        reward_post_process=post,
        num_gpus_per_node=args.num_gpus_per_node,
    )


def default_resource(args: argparse.Namespace, judge_gpus: int) -> dict[str, list[int]]:
    """The layout of a run without ``--resource``: the smallest one of its mode.

    fully-async: one GPU for the actor and one for rollout, the judges' own; defer-swap: the
    judges' GPUs shared by everyone; colocate: split, one rollout GPU beside the judges'.
    """
    if args.fully_async:
        resource = {"actor": [1, 1], "rollout": [1, 1]}
    elif args.defer_reward_to_post_process:
        g = max(judge_gpus, 1)
        resource = {"actor": [1, g], "rollout": [1, g]}
    else:
        resource = {"actor": [1, 1 + judge_gpus], "rollout": [1, 1]}
    if judge_gpus:
        resource["genrm"] = [1, judge_gpus]
    return resource


def layout_from_args(
    args: argparse.Namespace, *, sglang_overrides: Mapping[str, Any] | None = None
) -> LayoutRequest:
    """The layout of a run, for ``rl-core train`` and ``rl-core plan`` alike: ``--resource``
    parsed once and the judges built once from it; without ``--resource``, the smallest layout
    of the run's mode (:func:`default_resource`; colocate unless ``--fully-async``)."""
    check_reward_mode(args.rm_type, args.defer_reward_to_post_process)
    resource = parse_resource(args.resource) if args.resource is not None else None
    judges = judge_instances(args, resource)
    colocate = args.colocate
    if resource is None:
        judge_gpus = sum(s.num_gpus for s in judges.values())
        resource = parse_resource(default_resource(args, judge_gpus))
        colocate = colocate or not args.fully_async  # the default mode, when nothing was said
    return layout_request_from_args(
        args, resource=resource, genrm=judges, colocate=colocate, sglang_overrides=sglang_overrides
    )


def plan_from_args(
    args: argparse.Namespace, *, sglang_overrides: Mapping[str, Any] | None = None
) -> PlacementPlan:
    """The plan for parsed flags (:func:`add_placement_args`), the layout as ``rl-core train``
    takes it (:func:`layout_from_args`); raises PlacementError."""
    return plan_layout(layout_from_args(args, sglang_overrides=sglang_overrides))
