"""Test helpers for every package of the workspace: tiny models (``models.py``), a private local
Ray + Serve (``ray.py``), a fake SGLang (``fake_sglang.py``) and the scripted engine's
``model_path`` (:func:`scripted_model_path`).

Light to import: each helper imports its heavy dependencies (torch, transformers, Ray) when it is
called, so that a test module can import these at the top before Ray's environment is set.
"""

from __future__ import annotations

from genrm_serve.engines.scripted import scripted_model_path
from genrm_serve.testing.fake_sglang import FakeSGLangEngine
from genrm_serve.testing.models import (
    TINY_CHAT_TEMPLATE,
    TINY_SPECIAL_TOKENS,
    build_random_qwen3,
    build_tiny_model,
    build_tiny_tokenizer,
    require_embedded_model,
)
from genrm_serve.testing.ray import (
    free_port,
    lines_until,
    local_ray_serve,
    ray_test_env,
    serve_proxy,
)

__all__ = [
    "TINY_CHAT_TEMPLATE",
    "TINY_SPECIAL_TOKENS",
    "FakeSGLangEngine",
    "build_random_qwen3",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "free_port",
    "lines_until",
    "local_ray_serve",
    "ray_test_env",
    "require_embedded_model",
    "scripted_model_path",
    "serve_proxy",
]
