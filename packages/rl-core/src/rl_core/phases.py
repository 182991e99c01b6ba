"""The colocate state machine: which engines are awake in which phase, and the transitions.

Each phase (``inference``, ``reward``, ``train``) says, for each participant (``rollout``,
``genrm:<route_key>``, ``actor``, ...), whether it is ``active`` or ``asleep``. Entering a phase
first puts to sleep everything that must sleep — releasing memory — and only then wakes what must
wake, so two roles that share a GPU never both hold their memory. The tables come from the
placement plan (:func:`phases_from_plan`), so the driver runs exactly the phases ``rl-core plan``
prints; every transition is logged (tests assert on the log) and timed (the step metrics report
the seconds of every sleep, wake, offload and onload).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from rl_core.participants import is_judge

logger = logging.getLogger(__name__)

State = Literal["active", "asleep"]
PhaseName = str


class Sleeper(Protocol):
    async def sleep(self) -> None: ...

    async def wake(self) -> None: ...


@dataclass
class CallbackSleeper:
    """A participant whose sleep / wake are plain callables (e.g. trainer offload / onload)."""

    on_sleep: Callable[[], Awaitable[None] | None]
    on_wake: Callable[[], Awaitable[None] | None]

    async def sleep(self) -> None:
        r = self.on_sleep()
        if r is not None:
            await r

    async def wake(self) -> None:
        r = self.on_wake()
        if r is not None:
            await r


@dataclass
class GroupSleeper:
    """Several engines that sleep and wake together (all rollout engines), concurrently."""

    members: Sequence[Sleeper]

    async def sleep(self) -> None:
        await asyncio.gather(*(m.sleep() for m in self.members))

    async def wake(self) -> None:
        await asyncio.gather(*(m.wake() for m in self.members))


def phases_from_plan(plan: Any) -> dict[PhaseName, dict[str, State]]:
    """``PlacementPlan.phases`` → ``{phase: {who: state}}``."""
    return {phase.name: {act.who: act.state for act in phase.activities} for phase in plan.phases}


@dataclass
class PhaseMachine:
    """Drives participants through the phases of a table; everything starts ``active``."""

    phases: Mapping[PhaseName, Mapping[str, State]]
    participants: Mapping[str, Sleeper]
    states: dict[str, State] = field(default_factory=dict)
    log: list[tuple[str, str, str]] = field(default_factory=list)
    current: str | None = None
    #: what sleep / wake mean per participant in the timings (the trainer offloads / onloads)
    actions: Mapping[str, tuple[str, str]] = field(
        default_factory=lambda: {"actor": ("offload", "onload")}
    )
    #: ``(phase, who, action, seconds)`` of every transition since the last :meth:`take_timings`
    timings: list[tuple[str, str, str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for who in self.participants:
            self.states.setdefault(who, "active")

    async def enter(self, phase: PhaseName) -> None:
        if phase not in self.phases:
            raise KeyError(f"phase {phase!r} is not in this mode's table ({sorted(self.phases)})")
        wanted = self.phases[phase]
        to_sleep = [w for w, s in wanted.items() if s == "asleep" and w in self.participants]
        to_wake = [w for w, s in wanted.items() if s == "active" and w in self.participants]
        await self._move(phase, [w for w in to_sleep if self.states[w] != "asleep"], "asleep")
        await self._move(phase, [w for w in to_wake if self.states[w] != "active"], "active")
        self.current = phase

    async def set_state(self, who: str, state: State, *, reason: str) -> None:
        """Move one participant outside the table (e.g. the judge after a deferred batch)."""
        if who in self.participants and self.states[who] != state:
            await self._move(reason, [who], state)

    async def _move(self, phase: str, whos: list[str], state: State) -> None:
        if not whos:
            return

        async def one(who: str) -> None:
            p = self.participants[who]
            t0 = time.perf_counter()
            await (p.sleep() if state == "asleep" else p.wake())
            seconds = time.perf_counter() - t0
            self.states[who] = state
            self.log.append((phase, who, "sleep" if state == "asleep" else "wake"))
            names = self.actions.get(who, ("sleep", "wake"))
            action = names[0] if state == "asleep" else names[1]
            self.timings.append((phase, who, action, seconds))
            logger.info("phase %s: %s → %s (%.2f s)", phase, who, state, seconds)

        await asyncio.gather(*(one(w) for w in whos))

    def add(self, who: str, sleeper: Sleeper, state: State = "active") -> None:
        """A participant that joins after the machine was built (the trainer, which loads only
        once the engines sharing its GPUs are asleep)."""
        participants = dict(self.participants)
        participants[who] = sleeper
        self.participants = participants
        self.states[who] = state

    def take_timings(self) -> dict[str, float]:
        """``{"<action>/<who>_s": seconds}`` summed since the last call, then reset."""
        out: dict[str, float] = {}
        for _, who, action, seconds in self.timings:
            key = f"{action}/{who}_s"
            out[key] = out.get(key, 0.0) + seconds
        self.timings = []
        return out

    def judges(self) -> list[str]:
        return [w for w in self.participants if is_judge(w)]
