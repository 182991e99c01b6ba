"""``rl-core plan``: the mode and GPU map for a set of flags, before any GPU is touched.

Accepts the whole ``rl-core train`` command line: flags that are not about placement are listed
on stderr as ignored, so a typo in a placement flag is never silent. With ``--preset`` or
``--config FILE`` the command line is read by train's own parser (the preset and the file under the
flags, as train applies them), so the plan printed is the plan train would run; every flag is then
a train flag and an unknown one is refused as train refuses it. An invalid layout exits with
status 2 and the message that says how to fix it.
"""

from __future__ import annotations

import argparse
import json
import sys

from rl_core.placement.args import add_placement_args, plan_from_args
from rl_core.placement.errors import PlacementError
from rl_core.placement.plan import PlacementPlan
from rl_core.placement.render import render_plan
from rl_core.placement.sglang_flags import pop_sglang_overrides

__all__ = ["ACCEPTS_UNKNOWN_FLAGS", "configure", "run"]

ACCEPTS_UNKNOWN_FLAGS = True


def configure(parser: argparse.ArgumentParser) -> None:
    add_placement_args(parser)
    parser.add_argument(
        "--json", action="store_true", help="print the plan as JSON (with its 'mode') instead"
    )
    # train's own flags: with either, train's parser reads the whole command line
    parser.add_argument(
        "--preset", metavar="NAME", default=None, help="plan train's ready-made job (cpu-demo)"
    )
    parser.add_argument(
        "--config", metavar="FILE", default=None, help="plan train's YAML/JSON file of flag values"
    )


def run(args: argparse.Namespace) -> int:
    if args.preset is not None or args.config is not None:
        return _run_as_train(args)
    try:  # what the parser left over: a --sglang-* flag there is an SGLang server argument
        unknown, overrides = pop_sglang_overrides(getattr(args, "unknown_flags", []), known=())
    except PlacementError as err:
        print(f"rl-core plan: error: {err}", file=sys.stderr)
        return 2
    backend, unknown = _training_backend(unknown)
    if unknown:
        print(
            "rl-core plan: ignoring arguments that are not about placement: " + " ".join(unknown),
            file=sys.stderr,
        )
    try:
        plan = plan_from_args(args, sglang_overrides=overrides)
    except PlacementError as err:
        print(f"rl-core plan: error: {err}", file=sys.stderr)
        return 2
    if backend is not None:  # the sizes against the actor's GPUs, refused as train refuses them
        from rl_core.backends.megatron.parallel import (
            ParallelConfigError,
            check_parallel_sizes,
            megatron_config_from,
        )

        try:
            check_parallel_sizes(len(plan.roles["actor"].bundles), megatron_config_from(backend))
        except ParallelConfigError as err:
            print(f"rl-core plan: error: {err}", file=sys.stderr)
            return 2
    return _print(plan, as_json=args.json)


def _print(plan: PlacementPlan, *, as_json: bool) -> int:
    if as_json:
        print(json.dumps(plan.model_dump(mode="json"), indent=2))
    else:
        print(render_plan(plan))
    return 0


def _run_as_train(args: argparse.Namespace) -> int:
    """The plan of ``rl-core train``'s own reading of the command line (preset and config file
    included): what train would realise, refused with train's message where train refuses.
    Imports train's config module (and with it torch), so this path takes seconds, not the
    fraction of a second of a plain placement plan."""
    from rl_core.config import ConfigError, parse_train_namespace

    argv = [a for a in getattr(args, "subcommand_argv", []) if a != "--json"]
    try:
        ns, overrides = parse_train_namespace(argv, prog="rl-core plan")
        plan = plan_from_args(ns, sglang_overrides=overrides)
        if ns.train_backend == "megatron":
            from rl_core.backends.megatron.parallel import (
                ParallelConfigError,
                check_parallel_sizes,
                megatron_config_from,
            )

            try:
                check_parallel_sizes(len(plan.roles["actor"].bundles), megatron_config_from(ns))
            except ParallelConfigError as err:
                raise PlacementError(str(err)) from err
    except (ConfigError, PlacementError) as err:
        print(f"rl-core plan: error: {err}", file=sys.stderr)
        return 2
    return _print(plan, as_json=args.json)


def _training_backend(flags: list[str]) -> tuple[argparse.Namespace | None, list[str]]:
    """``--train-backend megatron`` and its parallel sizes among the flags that are not about
    placement (the rest stay "ignored"). Read only when given: the megatron flags' module
    imports torch, and a plan of any other run takes a fraction of a second."""
    if not any(f.split("=", 1)[0] == "--train-backend" for f in flags):
        return None, flags
    from rl_core.backends.megatron.parallel import add_megatron_args

    parser = argparse.ArgumentParser(prog="rl-core plan", add_help=False)
    parser.add_argument("--train-backend", choices=["torch", "megatron"], default="torch")
    add_megatron_args(parser)
    ns, rest = parser.parse_known_args(flags)
    return (ns if ns.train_backend == "megatron" else None), rest
