"""``rl-core train`` / ``python -m rl_core.train``: GRPO with GenRM judges (the original's
``relax/entrypoints/train.py``; same flag names)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from rl_core.config import ConfigError, build_parser, parse_train_args

#: ``rl-core train`` passes its whole command line through (the train parser owns the flags).
ACCEPTS_UNKNOWN_FLAGS = True


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("rl_core").setLevel(logging.INFO)
    try:
        cfg, ns = parse_train_args(argv)
    except ConfigError as err:
        print(f"rl-core train: {err}", file=sys.stderr)
        return 2
    from rl_core.launch import run_training

    return asyncio.run(run_training(cfg, ns))


# --- the ``rl-core train`` subcommand ------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = build_parser().description
    parser.add_argument("train_flags", nargs=argparse.REMAINDER, help="see rl-core train --help")


def run(args: argparse.Namespace) -> int:
    flags = list(getattr(args, "train_flags", []) or []) + list(
        getattr(args, "unknown_flags", []) or []
    )
    return main(flags)


if __name__ == "__main__":
    raise SystemExit(main())
