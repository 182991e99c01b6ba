"""``rl-core plan``: the mode and GPU map for a set of flags, before any GPU is touched.

Accepts the whole ``rl-core train`` command line: flags that are not about placement are listed
on stderr as ignored, so a typo in a placement flag is never silent. An invalid layout exits with
status 2 and the message that says how to fix it.
"""

from __future__ import annotations

import argparse
import json
import sys

from rl_core.placement.args import add_placement_args, plan_from_args
from rl_core.placement.errors import PlacementError
from rl_core.placement.render import render_plan
from rl_core.placement.sglang_flags import pop_sglang_overrides

__all__ = ["ACCEPTS_UNKNOWN_FLAGS", "configure", "run"]

ACCEPTS_UNKNOWN_FLAGS = True


def configure(parser: argparse.ArgumentParser) -> None:
    add_placement_args(parser)
    parser.add_argument(
        "--json", action="store_true", help="print the plan as JSON (with its 'mode') instead"
    )


def run(args: argparse.Namespace) -> int:
    try:  # what the parser left over: a --sglang-* flag there is an SGLang server argument
        unknown, args.sglang_overrides = pop_sglang_overrides(
            getattr(args, "unknown_flags", []), known=()
        )
    except PlacementError as err:
        print(f"rl-core plan: error: {err}", file=sys.stderr)
        return 2
    if unknown:
        print(
            "rl-core plan: ignoring arguments that are not about placement: " + " ".join(unknown),
            file=sys.stderr,
        )
    try:
        plan = plan_from_args(args)
    except PlacementError as err:
        print(f"rl-core plan: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan.model_dump(mode="json"), indent=2))
    else:
        print(render_plan(plan))
    return 0
