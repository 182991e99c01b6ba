"""The judge service on real models: the embedded Gemma 3 270M and a tiny random-weight model.

Real Ray Serve, real HTTP on loopback, real transformers engines on CPU, called through
genrm-client and the OpenAI-compatible endpoint. The models' verdicts mean nothing (a base
model, random weights), so nothing here asserts them: what is asserted is the path (answers,
token counts, the real tokenizer's 413, health, metrics).
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

JUDGE = [
    {"role": "system", "content": "You are a strict grader. Reply 1 or 0."},
    {
        "role": "user",
        "content": "Question: what is 3 + 4?\nReference answer: 7\nModel answer: 7\n"
        "Are they consistent? Reply 1 or 0.",
    },
]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, shared_ray: None) -> Iterator[str]:
    from genrm_serve.app import build_app, deploy, wait_until_healthy
    from genrm_serve.config import build_instances
    from genrm_serve.serve_args import ServeArgs
    from genrm_serve.testing import build_tiny_model, require_embedded_model, serve_proxy

    require_embedded_model()
    tiny = build_tiny_model(Path(tmp_path_factory.mktemp("tiny")) / "model")
    instances = build_instances(
        instances={
            "gemma": {
                "model_path": "embedded",
                "num_gpus": 1,
                "engine": "hf",
                "sampling_config": {"temperature": 0.0, "max_response_len": 2},
            },
            "tiny": {
                "model_path": str(tiny),
                "num_gpus": 1,
                "engine": "hf",
                "engine_config": {"max_context_len": 64},
                "sampling_config": {"temperature": 0.0, "max_response_len": 2},
            },
        }
    )
    with serve_proxy() as port:
        args = ServeArgs(port=port, api_key=None, engine_num_cpus=0.5)
        deploy(build_app(instances, args=args), args)
        wait_until_healthy(args, 600)  # a cold cache converts the Gemma GGUF once (~2 min)
        yield args.url


def test_health_lists_both_model_instances(service: str) -> None:
    r = httpx.get(f"{service}/health", timeout=30)
    assert r.status_code == 200
    assert r.json()["instances"] == {"gemma": {"status": "healthy"}, "tiny": {"status": "healthy"}}


async def test_the_embedded_gemma_judges_through_the_client(service: str) -> None:
    from genrm_client import AsyncGenRMClient

    async with AsyncGenRMClient(service, max_retries=0, timeout=300) as client:
        full = await client.generate_full(JUDGE, route_key="gemma")
        texts = await client.generate_many(
            [{"messages": JUDGE, "route_key": "gemma"}] * 4, concurrency=4
        )
    assert isinstance(full.response, str)
    assert full.meta is not None
    assert full.meta.route_key == "gemma" and full.meta.engine_id == "gemma/0"
    assert full.meta.prompt_tokens is not None and full.meta.prompt_tokens > 20
    assert full.meta.completion_tokens is not None and 1 <= full.meta.completion_tokens <= 2
    assert full.meta.cached_prompt_tokens == 0  # a lone request shares its prompt with none
    assert len(texts) == 4


def test_openai_endpoint_on_the_embedded_model(service: str) -> None:
    r = httpx.post(
        f"{service}/v1/chat/completions",
        json={"model": "gemma", "messages": JUDGE, "max_tokens": 1, "temperature": 0},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 1
    assert body["usage"]["prompt_tokens"] > 20


def test_real_tokenizer_counts_and_refuses_a_long_prompt(service: str) -> None:
    ok = httpx.post(
        f"{service}/generate",
        json={"messages": [{"role": "user", "content": "1 or 0?"}], "route_key": "tiny"},
        timeout=120,
    )
    assert ok.status_code == 200, ok.text
    long = {"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 20}
    r = httpx.post(
        f"{service}/generate", json={"messages": [long], "route_key": "tiny"}, timeout=120
    )
    assert r.status_code == 413
    assert "max_context_len=64" in r.json()["error"]["message"]


def test_metrics_count_real_tokens(service: str) -> None:
    text = httpx.get(f"{service}/metrics", timeout=30).text
    line = next(
        ln
        for ln in text.splitlines()
        if ln.startswith('genrm_prompt_tokens_total{route_key="gemma"}')
    )
    assert float(line.split()[-1]) > 100
