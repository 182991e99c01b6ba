"""One line for a run that lost a process it cannot simply re-create (a trainer rank, an engine
on a weight path that cannot take a new one): which process, Ray's cause, and the command that
resumes. No traceback: the user's next step is the command, not Ray's internals.

Ray's ``ActorDiedError`` carries what it knows as text (class, name, pid, ip, then its cause:
killed by ``ray.kill``, the memory monitor's figures, a node that died); this module reads it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_core.checkpoints import LATEST

__all__ = [
    "ProcessLostError",
    "find_lost_actor",
    "lost_actor_error",
    "lost_process_line",
    "lost_process_what",
    "lost_trainer_rank",
    "resume_command",
]

#: The header lines of Ray's message (what the process was), not its cause.
_HEADER = re.compile(r"^\s*(class_name|actor_id|pid|name|namespace|ip):\s*(.*)$")
#: What Ray's memory monitor's message begins with, and its figures.
_OOM = re.compile(r"Memory on the node .*? was ([\d.]+GB used / [\d.]+GB limit)")
#: rl-core's actor names: ``rl-core-<run>:<role>-<rank>``.
_PREFIX = re.compile(r"^rl-core-[0-9a-f]+:")
#: The transport error inside Ray's message for an actor it cannot reach.
_RPC = re.compile(r"(RpcError: .*?)(?: rpc_code: \d+|\. The task|$)")
_CAUSE_CHARS = 300


def _drop_flag(argv: Sequence[str], flag: str) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == flag:
            skip = True
            continue
        if arg.startswith(flag + "="):
            continue
        out.append(arg)
    return out


def resume_command(argv: Sequence[str], save: str | None) -> str | None:
    """The command that resumes this run from its last checkpoint (None without ``--save``, or
    before its first checkpoint was written)."""
    if not save or not (Path(save) / LATEST).exists():
        return None
    return shlex.join(["rl-core", "train", *_drop_flag(argv, "--load"), "--load", save])


def lost_actor_error(err: BaseException) -> BaseException | None:
    """Ray's error for a process that died, if ``err`` is one or was raised from one (a
    deadline, an engine's ``EngineGoneError``, a task group), else None."""
    from ray.exceptions import OutOfMemoryError, RayActorError

    for e in _chain(err):
        if isinstance(e, RayActorError | OutOfMemoryError):
            return e
    return None


class ProcessLostError(RuntimeError):
    """A step's own error (a judge failure, a deadline) behind which the run found a process it
    lost (``what`` "trainer rank", ``name`` "actor-1"): raised from Ray's error for that
    process, so the run restarts (``rl_core.restarts``) or ends on the lost process's line, as
    if Ray's error had come first."""

    def __init__(self, message: str, what: str, name: str) -> None:
        super().__init__(message)
        self.what, self.name = what, name


async def find_lost_actor(
    actors: Sequence[tuple[Any, Any]], timeout_s: float
) -> tuple[Any, BaseException] | None:
    """The first of ``actors`` (a label, a Ray actor handle) that is gone, with Ray's error,
    asked of all at once (``__ray_ready__``, which every actor answers); None when each
    answered, or was still busy, within ``timeout_s``."""
    import asyncio

    from ray.exceptions import RayActorError

    async def ask(handle: Any) -> BaseException | None:
        try:
            await asyncio.wait_for(handle.__ray_ready__.remote(), timeout_s)
        except RayActorError as err:
            return err
        except TimeoutError:
            return None  # busy (a call still running), not gone
        return None

    found = await asyncio.gather(*(ask(handle) for _, handle in actors))
    return next(((name, e) for (name, _), e in zip(actors, found, strict=True) if e), None)


def _chain(err: BaseException) -> list[BaseException]:
    seen: dict[int, BaseException] = {}
    todo = [err]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen[id(e)] = e
        todo += [x for x in (e.__cause__, e.__context__, getattr(e, "cause", None)) if x]
        if isinstance(e, BaseExceptionGroup):
            todo += list(e.exceptions)
    return list(seen.values())


def lost_process_what(err: BaseException, within: BaseException | None = None) -> str:
    """``err`` (Ray's actor error) as "lost <what> <name> (pid, ip): <cause>"; ``within``: the
    error it was found under, which may name the engine when Ray's error does not (an actor
    Ray cannot reach carries only its id)."""
    from ray.exceptions import ActorUnavailableError

    from genrm_serve import EngineGoneError

    text = str(getattr(err, "cause", None) or err)
    fields: dict[str, str] = {}
    rest: list[str] = []
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            fields[m[1]] = m[2].strip()
        elif line.strip() and "died unexpectedly before finishing" not in line:
            rest.append(line.strip())
    chain = _chain(within or err)
    engine = next((e.engine_id for e in chain if isinstance(e, EngineGoneError)), None)
    found = next((e for e in chain if isinstance(e, ProcessLostError)), None)
    name = _PREFIX.sub("", fields.get("name", "")) or engine or fields.get("class_name", "")
    what = "trainer rank" if fields.get("class_name") == "TrainWorker" else "process"
    if not fields.get("name") and engine:
        what = "engine"
    if not fields.get("name") and found:
        what, name = found.what, found.name
    where = ", ".join(f"{k} {fields[k]}" for k in ("pid", "ip") if k in fields)
    oom = _OOM.search(text)
    rpc = _RPC.search(text)
    if oom:
        cause = f"killed by Ray's memory monitor ({oom[1]})"
    elif isinstance(err, ActorUnavailableError):
        cause = "Ray cannot reach it (its node is down or cut off)" + (f": {rpc[1]}" if rpc else "")
    else:
        cause = " ".join(rest) or "unknown"
    if len(cause) > _CAUSE_CHARS:
        cause = cause[: _CAUSE_CHARS - 3] + "..."
    return f"lost {what} {name or 'a Ray actor'}" + (f" ({where})" if where else "") + f": {cause}"


def lost_trainer_rank(err: BaseException) -> bool:
    """Whether ``err`` (a run's error) is the loss of a trainer rank."""
    ray_err = lost_actor_error(err)
    return ray_err is not None and lost_process_what(ray_err, err).startswith("lost trainer rank ")


def lost_process_line(
    err: BaseException, argv: Sequence[str], save: str | None, note: str | None = None
) -> str:
    """``err`` (Ray's actor error, or an error raised from one) as the run's last line;
    ``note``: why the run did not restart itself (``rl_core.restarts``)."""
    line = lost_process_what(lost_actor_error(err) or err, err) + (f"; {note}" if note else "")
    command = resume_command(argv, save)
    if command is None:
        why = "the run had no --save" if not save else f"none was written to {save} yet"
        return line + f"; no checkpoint to resume from ({why})"
    return line + f"; resume from the last checkpoint with: {command}"
