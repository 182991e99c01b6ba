"""Reward functions by name (``--rm-type``) and custom ones by path (``--custom-rm-path``).

Built-ins: ``dapo-genrm`` (LLM judge vs reference), ``math`` (math-verify, no judge), ``dummy``
(defer mode placeholder), ``dual-genrm`` (quality + safety judges), ``agentic-genrm`` (a judge
per trajectory module), ``rubric-genrm`` (weighted criteria, a judge question each),
``pairwise-genrm`` (a group's responses compared in pairs; group-level: it has only a batch
variant, see :func:`is_group_level`). Every name has a batch variant: a native one where there
is one (``dapo-genrm`` and ``rubric-genrm`` score a group in one ``generate_batch``), else the
per-sample function run concurrently over the batch. Custom functions must be
``async def fn(args, sample) -> dict``; loading checks that at start-up, not on the first
sample.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from genrm_rewards import agentic, dapo_genrm, dual, pairwise, rubric, rules
from genrm_rewards.errors import RewardConfigError
from genrm_rewards.types import BatchRewardFn, RewardFn, SampleLike

__all__ = [
    "as_batch",
    "available",
    "get_batch_reward_fn",
    "get_reward_fn",
    "is_group_level",
    "load_custom",
    "register",
    "resolve_reward_fn",
]


@dataclass(frozen=True)
class _Entry:
    fn: RewardFn
    batch_fn: BatchRewardFn | None
    #: scores a group as a whole (a response's score depends on the others): batch only
    group_level: bool = False


_REGISTRY: dict[str, _Entry] = {}


def _is_async_callable(obj: Any) -> bool:
    if inspect.iscoroutinefunction(obj):
        return True
    call = getattr(obj, "__call__", None)  # noqa: B004 - an instance with an async __call__
    return call is not None and not inspect.isclass(obj) and inspect.iscoroutinefunction(call)


def register(
    name: str,
    fn: RewardFn,
    *,
    batch_fn: BatchRewardFn | None = None,
    replace: bool = False,
    group_level: bool = False,
) -> None:
    """Make ``fn`` (and optionally its batch variant) available as ``--rm-type name``.

    ``group_level``: the reward scores a GRPO group as a whole (``batch_fn`` is required and is
    the only way to score; a trainer calls it once per complete group, see
    :func:`is_group_level`)."""
    if not name or not isinstance(name, str):
        raise RewardConfigError(f"reward name must be a non-empty string, got {name!r}")
    if name in _REGISTRY and not replace:
        raise RewardConfigError(f"reward {name!r} is already registered (pass replace=True)")
    for label, obj in (("fn", fn), ("batch_fn", batch_fn)):
        if obj is not None and not _is_async_callable(obj):
            raise RewardConfigError(
                f"reward {name!r}: {label}={obj!r} is not an async callable (async def)"
            )
    if group_level and batch_fn is None:
        raise RewardConfigError(f"reward {name!r}: a group-level reward needs a batch_fn")
    _REGISTRY[name] = _Entry(fn, batch_fn, group_level)


def available() -> list[str]:
    """The registered names."""
    return sorted(_REGISTRY)


def get_reward_fn(name: str) -> RewardFn:
    """The per-sample function registered as ``name``."""
    entry = _REGISTRY.get(name)
    if entry is None:
        raise RewardConfigError(
            f"unknown reward type rm_type={name!r}; registered: {', '.join(available())} "
            "(or load your own with --custom-rm-path module.func)"
        )
    return entry.fn


def is_group_level(name: str) -> bool:
    """Whether ``name`` scores a group as a whole (its batch variant, once the group is
    complete) rather than each sample on its own."""
    get_reward_fn(name)  # an unknown name is refused with the registered ones
    return _REGISTRY[name].group_level


def as_batch(fn: RewardFn) -> BatchRewardFn:
    """A batch variant of a per-sample function: every sample scored concurrently, in order."""

    async def batch(args: Any, samples: Sequence[SampleLike]) -> Sequence[Mapping[str, Any]]:
        return list(await asyncio.gather(*(fn(args, s) for s in samples)))

    batch.__name__ = f"batch_{getattr(fn, '__name__', 'reward')}"
    return batch


def get_batch_reward_fn(name: str) -> BatchRewardFn:
    """The batch variant of ``name`` (native, or the per-sample function over the batch)."""
    fn = get_reward_fn(name)
    entry = _REGISTRY[name]
    return entry.batch_fn if entry.batch_fn is not None else as_batch(fn)


def load_custom(path: str, *, setting: str = "custom_rm_path") -> RewardFn:
    """Import ``package.module.func`` (or ``package.module:func``) and check it is async and
    takes two positional arguments (``args`` and a sample, or a batch for a post-process hook).

    ``setting`` is the name the errors give the path: reward functions and post-process hooks
    load the same way but come from different flags, and an error must name the one to fix.

    Raises:
        RewardConfigError: the path is malformed, the module cannot be found, the attribute is
            missing, it is not an async callable, or it cannot be called with two arguments.
    """
    text = path.strip() if isinstance(path, str) else ""
    module_name, sep, attr = text.rpartition(":") if ":" in text else text.rpartition(".")
    if not sep or not module_name or not attr:
        raise RewardConfigError(
            f"{setting}={path!r} must be 'module.func' or 'module:func' (a dotted module "
            "path and an attribute name)"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and module_name.startswith(err.name):
            raise RewardConfigError(
                f"{setting}={path!r}: module {module_name!r} not found (is it on "
                f"PYTHONPATH / installed? missing: {err.name!r})"
            ) from err
        raise RewardConfigError(
            f"{setting}={path!r}: module {module_name!r} was found but failed to import: {err}"
        ) from err
    fn = getattr(module, attr, None)
    if fn is None:
        public = sorted(n for n in vars(module) if not n.startswith("_"))
        raise RewardConfigError(
            f"{setting}={path!r}: module {module_name!r} has no attribute {attr!r} "
            f"(it defines: {', '.join(public[:20]) or 'nothing public'})"
        )
    if not _is_async_callable(fn):
        kind = "not callable" if not callable(fn) else "a synchronous callable"
        raise RewardConfigError(
            f"{setting}={path!r}: {module_name}.{attr} is {kind}; a reward function must "
            "be 'async def fn(args, sample) -> dict' (a post-process hook 'async def "
            "hook(args, samples)')"
        )
    _check_two_arguments(fn, f"{setting}={path!r}: {module_name}.{attr}")
    return fn  # type: ignore[no-any-return]


def _check_two_arguments(fn: Any, where: str) -> None:
    """A function that cannot take ``(args, sample)`` fails at load time, not on the first
    sample after every model has loaded."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a callable without a readable signature: not checked
        return
    try:
        signature.bind(None, None)
    except TypeError as err:
        raise RewardConfigError(
            f"{where}{signature} cannot be called with two arguments (args, sample): {err}"
        ) from None


def resolve_reward_fn(args: Any) -> RewardFn:
    """``args.custom_rm_path`` if set, else ``args.rm_type`` (default ``dapo-genrm``)."""
    custom = getattr(args, "custom_rm_path", None)
    if custom:
        return load_custom(custom)
    return get_reward_fn(getattr(args, "rm_type", None) or "dapo-genrm")


register("dapo-genrm", dapo_genrm.compute_score, batch_fn=dapo_genrm.compute_score_batch)
register("math", rules.compute_score)
register("dummy", rules.dummy)
register("dual-genrm", dual.compute_score)
register("agentic-genrm", agentic.compute_score)
register("rubric-genrm", rubric.compute_score, batch_fn=rubric.compute_score_batch)
register(
    "pairwise-genrm",
    pairwise.compute_score,
    batch_fn=pairwise.compute_score_batch,
    group_level=True,
)
