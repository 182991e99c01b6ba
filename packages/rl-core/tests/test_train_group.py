"""The trainer group: Ray actors in the plan's bundles, one gloo process group, data parallel.

On a local Ray without GPUs (CPU bundles): one optimizer step on 1 rank and on 2 ranks gives the
same parameters (the token-mean loss is normalised over the global batch and gradients are summed
over the ranks), and after a weight sync genrm-serve's hf rollout engine continues a prompt
greedily exactly as the trained model itself does.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from genrm_client.types import SamplingParams
from genrm_serve import EngineConfig, EngineRequest, InstanceSpec, create_engine_worker
from rl_core.backends.base import TrainItem
from rl_core.config import build_config
from rl_core.distributed import TrainGroup, split_by_tokens
from rl_core.placement.realize import create_placement_groups

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from genrm_serve.testing import build_tiny_model

    return Path(build_tiny_model(tmp_path_factory.mktemp("policy")))


def _items(n: int, vocab: int = 200, seed: int = 0) -> list[TrainItem]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt, response = rng.randint(3, 9), rng.randint(1, 12)
        tokens = [rng.randrange(5, vocab) for _ in range(prompt + response)]
        out.append(
            TrainItem(
                tokens=tokens,
                response_start=prompt,
                advantage=rng.uniform(-1.0, 1.0),
                in_loss=i % 5 != 4,  # some samples are masked (a judge failure)
                rollout_logprobs=None,
            )
        )
    return out


async def _group(model: Path, ranks: int, name: str, **extra: Any) -> tuple[TrainGroup, Any]:
    cfg = build_config(
        hf_checkpoint=str(model),
        prompt_data="unused.jsonl",
        rm_type="math",
        colocate=True,
        resource=f'{{"actor": [1, {ranks}]}}',
        lr=1e-4,  # the original uses 1e-6; Adam turns rounding noise into lr-sized steps
        weight_decay=0.1,
        max_tokens_per_gpu=64,  # several micro-batches per rank
        **extra,
    )
    realized = create_placement_groups(cfg.plan, use_gpus=False)
    group = TrainGroup(
        realized,
        "actor",
        str(model),
        cfg.backend,
        device="cpu",
        name_prefix=name,
        train_backend=cfg.train_backend,
        megatron=cfg.megatron,
    )
    where = await group.start()
    assert [w["rank"] for w in where] == list(range(ranks))
    return group, realized


def test_split_by_tokens_balances_and_keeps_order() -> None:
    items = _items(11)
    shards = split_by_tokens(items, 3)
    assert sorted(i for s in shards for i in s) == list(range(11))
    assert all(s == sorted(s) for s in shards)
    loads = [sum(len(items[i].tokens) for i in s) for s in shards]
    assert max(loads) - min(loads) <= max(len(it.tokens) for it in items)


async def test_one_and_two_ranks_take_the_same_step(
    shared_ray: None, model: Path, tmp_path: Path
) -> None:
    items = _items(10)
    weights = {}
    metrics = {}
    for ranks in (1, 2):
        group, realized = await _group(model, ranks, f"dp{ranks}-")
        metrics[ranks] = await group.train(items, batch_size=len(items))
        weights[ranks] = await (await group.export_weights())
        if ranks == 2:  # --save-hf: rank 0 writes the trained policy
            await group.save_hf(tmp_path / "hf", "fp32")
            _assert_hf_folder(tmp_path / "hf", weights[2])
        await group.shutdown()
        realized.remove()
    assert weights[1].keys() == weights[2].keys()
    for name, w in weights[1].items():
        assert torch.allclose(w, weights[2][name], atol=1e-5, rtol=0), name
    initial = _initial(model)
    assert any(not torch.equal(weights[1][k], v) for k, v in initial.items())  # it trained
    for key in ("loss", "pg_loss", "train_tokens", "grad_norm"):
        assert metrics[1][key] == pytest.approx(metrics[2][key], rel=1e-4, abs=1e-6), key


async def test_megatron_ranks_take_the_torch_step(
    shared_ray: None, model: Path, tmp_path: Path
) -> None:
    """``--train-backend megatron`` through the same group: 2 data-parallel ranks give the
    HF-named weights the torch backend's single rank gives (tensor parallelism is checked in
    test_megatron_backend.py; the tiny model's vocabulary of 465 does not split in two)."""
    pytest.importorskip("megatron.core", reason="needs the genrm-rl-core[megatron] extra")
    items = _items(10)
    torch_group, torch_realized = await _group(model, 1, "t1-")
    await torch_group.train(items, batch_size=len(items))
    expected = await (await torch_group.export_weights())
    await torch_group.shutdown()
    torch_realized.remove()
    group, realized = await _group(model, 2, "mg2-", train_backend="megatron")
    assert group.data_parallel_size == 2
    await group.train(items, batch_size=len(items))
    got = await (await group.export_weights())
    await group.save_hf(tmp_path / "hf", "fp32")  # every rank joins, rank 0 writes
    await group.shutdown()
    realized.remove()
    _assert_hf_folder(tmp_path / "hf", got)
    assert got.keys() == expected.keys()
    for name, w in expected.items():
        assert torch.allclose(got[name], w, atol=1e-5, rtol=0), name


def _assert_hf_folder(folder: Path, weights: dict[str, torch.Tensor]) -> None:
    """``folder`` is an HF model folder (with the base's tokenizer) holding exactly ``weights``."""
    from transformers import AutoModelForCausalLM

    assert (folder / "tokenizer_config.json").is_file()
    loaded = dict(
        AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).named_parameters()
    )
    for k, v in weights.items():
        assert torch.equal(loaded[k].detach(), v), k


def _initial(model: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    return {k: v.detach() for k, v in m.named_parameters()}


async def test_after_a_weight_sync_the_engine_continues_as_the_trained_model(
    shared_ray: None, model: Path
) -> None:
    from transformers import AutoModelForCausalLM

    group, realized = await _group(model, 2, "sync-")
    await group.train(_items(8, seed=3), batch_size=8)
    ref = await group.export_weights()
    spec = InstanceSpec(
        route_key="rollout",
        model_path=str(model),
        num_gpus=1,
        engine="hf",
        engine_config=EngineConfig(device="cpu", max_context_len=256),
    )
    engine = create_engine_worker(spec, 0, num_gpus=0, num_cpus=0.1)
    await engine.start.remote()
    assert await engine.update_weights.remote(ref, 1) == 1
    prompt = [1, 17, 42, 99, 7, 23]
    request = EngineRequest(
        sampling=SamplingParams(temperature=0.0, max_response_len=10),
        prompt_token_ids=prompt,
        return_tokens=True,
    )
    (out,) = await engine.generate_many.remote([request])
    trained = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    trained.load_state_dict(await ref, strict=False)
    expected = trained.generate(
        torch.tensor([prompt]), max_new_tokens=10, do_sample=False, pad_token_id=0
    )[0, len(prompt) :].tolist()
    assert out.token_ids == expected[: len(out.token_ids)] and out.token_ids
    assert out.weight_version == 1
    ray.kill(engine)
    await group.shutdown()
    realized.remove()
