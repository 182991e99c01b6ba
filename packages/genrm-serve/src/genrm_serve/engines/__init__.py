"""Judge engines behind one interface, and the factory that picks one for an instance.

Engine modules import their heavy dependencies (torch, transformers, SGLang) only when an engine
of that kind is made, so the service and the test engine run without them.
"""

from __future__ import annotations

import importlib.util

from genrm_serve.config import InstanceSpec
from genrm_serve.engines.base import (
    Engine,
    EngineAsleepError,
    EngineError,
    EngineOutput,
    EngineRequest,
    EngineState,
    PromptTooLongError,
    RequestRefusedError,
)

__all__ = [
    "Engine",
    "EngineAsleepError",
    "EngineError",
    "EngineOutput",
    "EngineRequest",
    "EngineState",
    "PromptTooLongError",
    "RequestRefusedError",
    "make_engine",
    "resolve_engine_kind",
]


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def resolve_engine_kind(spec: InstanceSpec) -> str:
    """The concrete engine kind for ``spec.engine``.

    ``auto``: the test engine for a ``scripted`` model_path; SGLang when a CUDA GPU is visible and
    SGLang is installed; otherwise the embedded transformers engine (``hf``).
    """
    kind = spec.engine
    if kind != "auto":
        return kind
    from genrm_serve.engines.scripted import SCRIPTED_PREFIX

    if spec.model_path == SCRIPTED_PREFIX or spec.model_path.startswith(SCRIPTED_PREFIX + ":"):
        return "scripted"
    if _cuda_available() and importlib.util.find_spec("sglang") is not None:
        return "sglang"
    return "hf"


def make_engine(spec: InstanceSpec, engine_id: str) -> Engine:
    """Build (not start) the engine ``spec`` asks for; ``engine_id`` is what it reports."""
    kind = resolve_engine_kind(spec)
    if kind == "scripted":
        from genrm_serve.engines.scripted import ScriptedEngine

        return ScriptedEngine(spec, engine_id)
    if kind == "hf":
        from genrm_serve.engines.hf import HFEngine

        hf: Engine = HFEngine(spec, engine_id)
        return hf
    if kind == "sglang":
        from genrm_serve.engines.sglang import SGLangEngine

        sgl: Engine = SGLangEngine(spec, engine_id)
        return sgl
    raise EngineError(
        f"genrm instance {spec.route_key!r}: engine={kind!r} is not one of "
        "['auto', 'hf', 'sglang', 'scripted']"
    )
