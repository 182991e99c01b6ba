"""Checks of judge instances that read the disk: run before Ray starts.

``InstanceSpec`` checks values; these look at what the values point to — the model folder, the
LoRA adapter folder, the engine actors' Python. Each used to fail only inside an engine actor,
after Ray and Serve had started (20–30 s, exit 1, tracebacks from every retry); here the first
problem is one :class:`InstanceFileError` naming the instance, the setting, the value and the
rule, in well under a second. ``genrm-serve run`` and ``rl-core train``'s preflight both call
:func:`check_instance_files`, each wording the setting as its own command line names it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from genrm_serve.config import GenRMConfigError, InstanceSpec

__all__ = ["InstanceFileError", "check_instance_files"]


class InstanceFileError(GenRMConfigError):
    """A file an instance names is missing or not what the setting needs."""

    def __init__(self, key: str, setting: str, value: str, reason: str) -> None:
        self.key, self.setting, self.value, self.reason = key, setting, value, reason
        super().__init__(f"instance {key!r}: {setting}={value!r}: {reason}")


def _is_scripted(spec: InstanceSpec) -> bool:
    """The test engine: its model_path is a script, not a folder."""
    return spec.engine == "scripted" or spec.model_path.split(":", 1)[0] == "scripted"


def check_instance_files(instances: Mapping[str, InstanceSpec]) -> None:
    """Raise :class:`InstanceFileError` for the first instance whose ``model_path`` is not a
    loadable model, whose ``engine_config.adapter_path`` is not a LoRA adapter folder, or whose
    ``engine_config.python_executable`` is not an executable file. Reads no weights."""
    from genrm_serve.models import check_model_path, resolve_adapter

    for key, spec in instances.items():
        if _is_scripted(spec):
            continue
        try:
            check_model_path(spec.model_path)
        except FileNotFoundError as err:
            raise InstanceFileError(key, "model_path", spec.model_path, str(err)) from None
        cfg = spec.engine_config
        try:
            resolve_adapter(spec.model_path, cfg.adapter_path)
        except FileNotFoundError as err:
            # resolve_adapter's message starts with where the adapter came from and its path
            reason = str(err).split(": ", 1)[-1]
            if cfg.adapter_path is None:
                reason = str(err)
            elif reason.startswith(repr(str(Path(cfg.adapter_path).expanduser()))):
                reason = reason.split(" ", 1)[1]
            value = cfg.adapter_path or "(the shipped adapter)"
            raise InstanceFileError(key, "engine_config.adapter_path", value, reason) from None
        exe = cfg.python_executable
        if exe is not None and not (Path(exe).expanduser().is_file() and os.access(exe, os.X_OK)):
            raise InstanceFileError(
                key,
                "engine_config.python_executable",
                exe,
                "not an executable file (the Python of the engine actors, e.g. an SGLang "
                "environment's .venv/bin/python)",
            )
