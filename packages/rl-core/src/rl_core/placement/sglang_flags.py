"""The rollout engines' SGLang server arguments, as the original takes them: ``--sglang-config``
(a YAML or JSON mapping of ``ServerArgs`` fields) and ``--sglang-KEY VALUE`` overrides on top
(``--sglang-attention-backend triton``, ``--sglang-disable-radix-cache``).

SGLang is often not installed where ``rl-core plan`` runs, so here only what needs no SGLang is
checked: the file, the values, and keys GenRM sets itself (each refused naming our flag). The
engine checks the keys against the installed SGLang's ``ServerArgs`` before its model loads.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from pathlib import Path
from typing import Any

import yaml

from genrm_serve.engines.sglang.launch import check_owned_server_args
from rl_core.placement.errors import PlacementError

__all__ = ["DETERMINISTIC_KEY", "FLAG_PREFIX", "pop_sglang_overrides", "rollout_server_args"]

FLAG_PREFIX = "--sglang-"
#: The one server argument a rollout user sets here although the engine owns it (a judge sets
#: ``engine_config.deterministic_inference``): the original's
#: ``--sglang-enable-deterministic-inference``, which is also what makes SGLang honour the run's
#: per-sample sampling seeds.
DETERMINISTIC_KEY = "enable_deterministic_inference"


def _value(flag: str, text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise PlacementError(f"{flag} {text!r}: not a YAML value ({err})") from None


def pop_sglang_overrides(
    argv: Sequence[str], known: Container[str]
) -> tuple[list[str], dict[str, Any]]:
    """``argv`` without the ``--sglang-*`` flags that are not ``known`` options, and those flags
    as ``{server_arg: value}``. A flag followed by another flag (or by nothing) is ``True``;
    values are read as YAML scalars (``8``, ``0.5``, ``false``, ``triton``)."""
    rest: list[str] = []
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, inline = arg.partition("=")
        if not name.startswith(FLAG_PREFIX) or name in known:
            rest.append(arg)
            i += 1
            continue
        key = name.removeprefix(FLAG_PREFIX).replace("-", "_")
        if eq:
            overrides[key] = _value(name, inline)
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            overrides[key] = _value(name, argv[i + 1])
            i += 2
        else:
            overrides[key] = True
            i += 1
    return rest, overrides


def rollout_server_args(config: str | None, overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``--sglang-config``'s mapping with the ``--sglang-*`` overrides on top, checked."""
    args: dict[str, Any] = {}
    if config is not None:
        path = Path(config)
        try:
            loaded = yaml.safe_load(path.read_text())
        except OSError as err:
            raise PlacementError(
                f"--sglang-config {config}: cannot read it ({err.strerror})"
            ) from None
        except yaml.YAMLError as err:
            raise PlacementError(f"--sglang-config {config}: not YAML / JSON ({err})") from None
        if not isinstance(loaded, dict):
            raise PlacementError(
                f"--sglang-config {config}: must hold a mapping of SGLang server arguments, "
                f"got {type(loaded).__name__}"
            )
        args.update(loaded)
    args.update(overrides or {})
    if not isinstance(args.get(DETERMINISTIC_KEY, False), bool):
        raise PlacementError(
            f"--sglang-enable-deterministic-inference {args[DETERMINISTIC_KEY]!r}: must be "
            "true or false"
        )
    try:
        owned = {k: v for k, v in args.items() if k != DETERMINISTIC_KEY}
        check_owned_server_args("--sglang-config / --sglang-*", owned)
    except ValueError as err:
        raise PlacementError(str(err)) from None
    return args
