"""Placement: ``--resource`` and the mode flags → a pure :class:`PlacementPlan` → Ray groups.

``plan_layout`` (or ``plan_from_args``) decides the mode and every role's and engine's bundles
without Ray; ``realize.create_placement_groups`` then puts the plan on a Ray cluster.
"""

from rl_core.placement.args import (
    add_placement_args,
    check_reward_mode,
    default_resource,
    judge_instances,
    layout_from_args,
    layout_request_from_args,
    parse_resource,
    plan_from_args,
)
from rl_core.placement.errors import PlacementError, PlacementUnavailableError
from rl_core.placement.plan import (
    Activity,
    EnginePlacement,
    GroupPlan,
    JudgePlacement,
    LayoutRequest,
    Mode,
    Phase,
    PlacementPlan,
    RolePlacement,
    RoleResource,
    plan_layout,
)
from rl_core.placement.render import render_plan

__all__ = [
    "Activity",
    "EnginePlacement",
    "GroupPlan",
    "JudgePlacement",
    "LayoutRequest",
    "Mode",
    "Phase",
    "PlacementError",
    "PlacementPlan",
    "PlacementUnavailableError",
    "RolePlacement",
    "RoleResource",
    "add_placement_args",
    "check_reward_mode",
    "default_resource",
    "judge_instances",
    "layout_from_args",
    "layout_request_from_args",
    "parse_resource",
    "plan_from_args",
    "plan_layout",
    "render_plan",
]
