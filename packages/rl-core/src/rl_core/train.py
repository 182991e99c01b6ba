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
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("rl_core").setLevel(logging.INFO)
    try:
        cfg = parse_train_args(argv)
    except ConfigError as err:
        print(f"rl-core train: {err}", file=sys.stderr)
        return 2
    from rl_core.launch import run_training
    from rl_core.placement import PlacementError, PlacementUnavailableError

    try:
        return asyncio.run(run_training(cfg))
    except (PlacementError, PlacementUnavailableError) as err:
        print(f"rl-core train: {err}", file=sys.stderr)
        return 2


# --- the ``rl-core train`` subcommand ------------------------------------------------------------

#: :func:`main` parses the whole command line again: the original's ``--sglang-KEY VALUE``
#: server arguments are taken there, and any other unknown flag is refused there.
ACCEPTS_UNKNOWN_FLAGS = True


def configure(parser: argparse.ArgumentParser) -> None:
    """The subcommand lists every train flag (for ``--help``); :func:`run` re-parses the command
    line itself because presets and ``--config`` files change the defaults before parsing."""
    parser.description = DESCRIPTION
    add_train_args(parser)


def run(args: argparse.Namespace) -> int:
    return main(list(args.subcommand_argv))


if __name__ == "__main__":
    raise SystemExit(main())
