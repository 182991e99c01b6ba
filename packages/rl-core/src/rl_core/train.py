"""``rl-core train`` / ``python -m rl_core.train``: GRPO with GenRM judges (the original's
``relax/entrypoints/train.py``; same flag names)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from rl_core.config import DESCRIPTION, ConfigError, add_train_args, parse_train_args


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 done, 2 a bad input (refused before Ray starts), 1 a failure of the run,
    128 + signal when stopped by SIGTERM (143) or SIGINT (130)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("rl_core").setLevel(logging.INFO)
    try:
        cfg = parse_train_args(argv)
        from rl_core.preflight import preflight

        preflight(cfg)
    except ConfigError as err:
        print(f"rl-core train: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "rl-core train: stopped by SIGINT before start-up; nothing was saved", file=sys.stderr
        )
        return 130
    from genrm_serve import EngineStartError
    from rl_core.launch import run_training
    from rl_core.placement import PlacementError, PlacementUnavailableError
    from rl_core.rewards import JudgeFailureError
    from rl_core.stopping import StopRequest
    from rl_core.trainer import CheckpointError

    stop = StopRequest()
    try:
        status = asyncio.run(run_training(cfg, stop=stop))
    except (PlacementError, PlacementUnavailableError) as err:
        print(f"rl-core train: {err}", file=sys.stderr)
        return 2
    except (asyncio.CancelledError, KeyboardInterrupt):
        # a signal during start-up (or a second one): cancelled, Serve and Ray stopped
        name = stop.name if stop.requested else "SIGINT"
        print(
            f"rl-core train: stopped by {name} (cancelled at once: nothing saved)", file=sys.stderr
        )
        return stop.exit_code
    except (EngineStartError, JudgeFailureError, CheckpointError) as err:
        print(f"rl-core train: {err}", file=sys.stderr)
        return 1
    if stop.report is not None:
        print(f"rl-core train: {stop.report}", file=sys.stderr)
    return status


# --- the ``rl-core train`` subcommand ------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    """The subcommand lists every train flag (for ``--help``); :func:`run` re-parses the command
    line itself because presets and ``--config`` files change the defaults before parsing."""
    parser.description = DESCRIPTION
    add_train_args(parser)


def run(args: argparse.Namespace) -> int:
    return main(list(args.subcommand_argv))


if __name__ == "__main__":
    raise SystemExit(main())
