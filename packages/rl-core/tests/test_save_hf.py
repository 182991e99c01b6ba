"""``rl-core train --save-hf DIR``: a completed run writes its final policy as a Hugging Face
folder, and its checkpoints record the base model ``rl-core export`` takes the tokenizer from.

One tiny in-process run (test engine, torch backend, ``LocalLearner``): the folder holds the
trained weights in the chosen dtype with the base model's tokenizer, loads as ``--hf-checkpoint``
(the trainer's own log-probs on it equal the run's) and in genrm-serve's hf engine.
"""

import json

import torch
from tiny_grpo import RecordingJudge, ScriptedReward, local_stack, make_trainer

from rl_core.checkpoints import read_checkpoint_state
from rl_core.rewards import RewardSetup

ITEMS_TOKENS = [[1, 5, 6, 7, 8, 9], [1, 4, 12, 13, 14, 15, 16]]


def _items():
    from rl_core.backends.base import TrainItem

    return [TrainItem(t, response_start=2, advantage=0.0, in_loss=True) for t in ITEMS_TOKENS]


async def _run(cfg, model_dir, tokenizer, make_engine):
    _engine, handle, backend, phases = await local_stack(
        cfg, model_dir, make_engine, RecordingJudge([])
    )
    setup = RewardSetup(args=cfg, reward_key="score", inline_fn=ScriptedReward())
    trainer = make_trainer(cfg, tokenizer, handle, backend, phases, setup)
    await trainer.run()
    return trainer, backend


async def test_a_completed_run_writes_its_final_policy_as_an_hf_folder(
    tmp_path, grpo_config, tiny_model_path, char_tokenizer, test_engine_factory
):
    import shutil

    from rl_core.backends.base import BackendConfig
    from rl_core.backends.torch_hf import TorchHFBackend

    base = tmp_path / "base"
    shutil.copytree(tiny_model_path, base)
    char_tokenizer.save_pretrained(base)
    out, ckpt = tmp_path / "hf", tmp_path / "ckpt"
    cfg = grpo_config(
        tmp_path,
        num_rollout=1,
        hf_checkpoint=str(base),
        save=str(ckpt),
        save_hf=str(out),
        save_hf_dtype="fp32",
    )
    trainer, backend = await _run(cfg, base, char_tokenizer, test_engine_factory)
    assert trainer.history[-1].metrics["train/untrained"] == 0  # the policy did change

    # the checkpoint records the base model, as an absolute folder
    extra = read_checkpoint_state(ckpt / "step_000001")["extra"]
    assert extra["base_model"] == str(base.resolve())

    # the folder: fp32 weights equal to the trained ones, the config says so, the tokenizer
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "float32" and config["use_cache"] is True
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    assert not any(p.suffix == ".pt" for p in out.iterdir())  # no optimizer state
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    trained = backend.export_weights()
    loaded = dict(hf.named_parameters())
    for k, v in trained.items():
        assert torch.equal(loaded[k].detach(), v), k

    # as --hf-checkpoint: the trainer's log-probs on the folder are the run's
    cfg_b = BackendConfig(temperature=cfg.rollout_temperature)
    want = TorchHFBackend(base, cfg_b)
    want.model.load_state_dict(backend.model.state_dict())
    got = TorchHFBackend(out, cfg_b).logprobs(_items())
    for g, w in zip(got, want.logprobs(_items()), strict=True):
        torch.testing.assert_close(g, w, atol=0, rtol=0)


async def test_genrm_serve_hf_engine_serves_the_folder(
    tmp_path, grpo_config, tiny_model_path, char_tokenizer, test_engine_factory
):
    """The bf16 folder of a run starts in genrm-serve's hf engine (its tokenizer, its weights)."""
    import shutil

    from genrm_serve import EngineConfig, InstanceSpec
    from genrm_serve.engines.hf import HFEngine

    base = tmp_path / "base"
    shutil.copytree(tiny_model_path, base)
    char_tokenizer.save_pretrained(base)
    out = tmp_path / "hf"
    cfg = grpo_config(tmp_path, num_rollout=1, hf_checkpoint=str(base), save_hf=str(out))
    _, backend = await _run(cfg, base, char_tokenizer, test_engine_factory)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"

    spec = InstanceSpec(
        route_key="policy",
        model_path=str(out),
        num_gpus=1,
        engine="hf",
        engine_config=EngineConfig(device="cpu", dtype="bfloat16"),  # type: ignore[call-arg]
    )
    engine = HFEngine(spec, "policy/0")
    await engine.start()
    served = dict(engine.model.named_parameters())
    for k, v in backend.export_weights().items():
        assert torch.equal(served[k].detach(), v.to(torch.bfloat16)), k
    assert engine.tokenizer("1+1").input_ids == char_tokenizer("1+1").input_ids
