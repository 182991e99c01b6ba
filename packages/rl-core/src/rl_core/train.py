"""``rl-core train`` / ``python -m rl_core.train``: GRPO with GenRM judges (the original's
``relax/entrypoints/train.py``; same flag names)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Coroutine, Sequence
from typing import Any, NoReturn, TypeVar

from rl_core.config import DESCRIPTION, ConfigError, add_train_args, parse_train_args

T = TypeVar("T")


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
    from rl_core.checkpoints import CheckpointError
    from rl_core.launch import run_training
    from rl_core.placement import PlacementError, PlacementUnavailableError
    from rl_core.rewards import JudgeFailureError
    from rl_core.stopping import StopRequest
    from rl_core.trainer import NothingToTrainError
    from rl_core.wandb_mirror import WandbStartError

    stop = StopRequest()
    try:
        status = _run(run_training(cfg, stop=stop))
    except (PlacementError, PlacementUnavailableError, WandbStartError) as err:
        print(f"rl-core train: {err}", file=sys.stderr)
        return 2
    except (asyncio.CancelledError, KeyboardInterrupt):
        # a signal during start-up (or a second one): cancelled, Serve and Ray stopped
        name = stop.name if stop.requested else "SIGINT"
        how = "at once by a second signal" if stop.count > 1 else "during start-up"
        _exit_now(stop.exit_code, f"stopped by {name} {how}: nothing saved")
    except (EngineStartError, JudgeFailureError, NothingToTrainError, CheckpointError) as err:
        print(f"rl-core train: {err}", file=sys.stderr)
        return 1
    except Exception as err:
        from rl_core.lost import lost_actor_error, lost_process_line
        from rl_core.restarts import RunLostError

        lost = lost_actor_error(err)
        if lost is None:
            raise
        # a process that died and was not re-created, and no restart from a checkpoint left
        # (rl_core.restarts): one line, no traceback (rl_core.lost)
        given = list(sys.argv[1:] if argv is None else argv)
        note = err.note if isinstance(err, RunLostError) else None
        line = lost_process_line(err, given, cfg.save, note)
        print(f"rl-core train: {line}", file=sys.stderr)
        return 1
    if stop.report is not None:
        _exit_now(status, stop.report)
    return status


def _run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` without its last step, waiting for the threads of the default executor:
    a blocking start-up call cut short by a signal (Serve's start, waiting on a Ray that is
    gone by then) may never return, and the command must still end."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        task = loop.create_task(main)
        try:
            return loop.run_until_complete(task)
        except KeyboardInterrupt:
            task.cancel()  # a SIGINT before our handler was installed: unwind the run
            loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
            raise
    finally:
        pending = asyncio.all_tasks(loop)
        for t in pending:
            t.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        asyncio.set_event_loop(None)
        loop.close()


def _exit_now(status: int, message: str) -> NoReturn:
    """Stopped by a signal, with Serve and Ray already shut down: say what was saved and exit,
    without joining worker threads still blocked in a call to the Ray that is gone."""
    print(f"rl-core train: {message}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(status)


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
