"""The ``rl-core`` command: a registry of subcommands, each in the module that owns it.

A subcommand is a module with ``configure(parser)`` (add its flags) and ``run(args) -> int`` (the
exit status). Only the chosen subcommand's module is imported, so ``rl-core plan`` starts fast and
needs neither torch nor a GPU. To add one, put a line in :data:`SUBCOMMANDS` (or call
:func:`register_subcommand` before :func:`main`).

A module may set ``ACCEPTS_UNKNOWN_FLAGS = True`` to receive the flags it does not know in
``args.unknown_flags`` instead of an error (``plan`` does, so a whole ``train`` command line can be
pasted after it).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

__all__ = ["SUBCOMMANDS", "Subcommand", "build_parser", "main", "register_subcommand"]


class _SubcommandModule(Protocol):
    def configure(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


@dataclass(frozen=True)
class Subcommand:
    """A registered subcommand: its module (imported only when chosen) and one-line help."""

    module: str
    help: str


#: name → subcommand; the training issue adds ``train`` and ``plot`` here.
SUBCOMMANDS: dict[str, Subcommand] = {
    "plan": Subcommand(
        "rl_core.placement.command",
        "print the placement plan (mode and GPU map) for train's flags, --preset and --config "
        "included; needs no GPU",
    ),
    "train": Subcommand(
        "rl_core.train", "GRPO training with GenRM judges (e.g. --preset cpu-demo)"
    ),
    "plot": Subcommand("rl_core.plot", "write reward / accuracy / length curves of a run to PNG"),
    "show": Subcommand(
        "rl_core.show",
        "a run in the terminal: its summary, curves' figures, a step's samples (--step N) with "
        "filters, one sample in full",
    ),
    "eval": Subcommand("rl_core.evaluate", "evaluate a model on an eval set as training does"),
    "export": Subcommand("rl_core.export", "write a checkpoint as a Hugging Face model folder"),
}


def register_subcommand(name: str, module: str, help: str) -> None:
    """Register (or replace) subcommand ``name`` implemented by ``module``."""
    SUBCOMMANDS[name] = Subcommand(module, help)


def _load(name: str) -> _SubcommandModule:
    return cast(_SubcommandModule, importlib.import_module(SUBCOMMANDS[name].module))


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; only ``chosen``'s flags are added (its module is imported)."""
    parser = argparse.ArgumentParser(
        prog="rl-core",
        description="Placement and GRPO training for RL with generative reward models (GenRM).",
        allow_abbrev=False,
    )
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, sub in SUBCOMMANDS.items():
        p = subs.add_parser(name, help=sub.help, description=sub.help, allow_abbrev=False)
        if name == chosen:
            _load(name).configure(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rl-core``; returns (and, as a script, exits with) the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    chosen = chosen if chosen in SUBCOMMANDS else None
    parser = build_parser(chosen)
    args, unknown = parser.parse_known_args(argv)
    module = _load(args.command)
    if unknown and not getattr(module, "ACCEPTS_UNKNOWN_FLAGS", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.unknown_flags = unknown
    # what followed the subcommand's name, for subcommands that parse their own command line
    args.subcommand_argv = argv[argv.index(args.command) + 1 :]
    return module.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
