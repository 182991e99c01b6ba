"""dapo-genrm end to end with a real model: the embedded Gemma 3 270M behind the hf engine.

Gemma 270M is a base model, so its verdicts mean nothing and none is asserted: the test proves
that a real model path (tokenizer, chat fallback, generation, the service, the client) produces
results in the reward contract — a score with ``ok`` / ``unparsed``, never a silent failure.
First use converts the model into ``$GENRM_CACHE_DIR`` (~70 s once); later runs load it in seconds.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("genrm_serve.app", reason="genrm-serve's Serve app is not installed")
pytest.importorskip("genrm_serve.engines.hf", reason="genrm-serve's hf engine is not installed")

from rewards_doubles import Args, Sample

from genrm_client import AsyncGenRMClient
from genrm_rewards.dapo_genrm import compute_score, compute_score_batch
from genrm_serve.app import build_app, deploy, wait_until_healthy
from genrm_serve.config import build_instances
from genrm_serve.serve_args import ServeArgs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def gemma_service(serve_port: int) -> Iterator[ServeArgs]:
    instances = build_instances(
        model_path="embedded",
        engine="hf",
        engine_config={"max_context_len": 1024, "max_batch_size": 4},
        sampling_config={"temperature": 0.0, "max_response_len": 4},
    )
    args = ServeArgs(port=serve_port, app_name="rewards-gemma", api_key=None, engine_num_cpus=0.5)
    deploy(build_app(instances, args=args), args)
    wait_until_healthy(args, 400)
    yield args


async def test_gemma_judges_through_dapo_genrm(gemma_service: ServeArgs) -> None:
    client = AsyncGenRMClient(base_url=gemma_service.url, timeout=300.0, max_retries=1)
    try:
        one = await compute_score(
            Args(verdict_cache=False),
            Sample(response="6 times 7 is 42. Answer: 42", label="42", prompt="What is 6*7?"),
            client=client,
        )
        group = await compute_score_batch(
            Args(verdict_cache=False),
            [Sample(response=f"Answer: {a}", label="42", prompt="6*7?") for a in ("42", "41")],
            client=client,
        )
    finally:
        await client.aclose()
    print(f"\nGemma verdicts: {one['pred']!r}, {[r['pred'] for r in group]!r}")
    for result in (one, *group):
        assert result["status"] in ("ok", "unparsed"), result
        assert result["score"] in (0.0, 1.0)
