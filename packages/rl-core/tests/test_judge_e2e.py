"""GRPO steps whose rewards come from the real judge service (Ray Serve, HTTP on loopback).

The judge is genrm-serve's scripted *test engine* behind the real service, and the reward is the
real dapo-genrm function through genrm-client: verdicts are known in advance (reply "1" when the
quoted model answer starts with a vowel or a digit), so the test can check that rewards vary,
advantages follow them, judge failures are masked, and the defer-swap hook sleeps and wakes the
judge through the service.
"""

import os
from types import SimpleNamespace

import pytest
import torch
from tiny_grpo import local_stack, make_trainer

from genrm_serve.testing import local_ray_serve, scripted_model_path
from rl_core.config import build_config
from rl_core.metrics import read_metrics
from rl_core.rewards import RewardSetup, defer_swap_post_process
from rl_core.services import JudgeSleeper

pytestmark = pytest.mark.slow

FIRST_CHARS = "aeiou0123456789"


@pytest.fixture(scope="module")
def judge():
    """A local Ray + the judge service: a good judge, a flaky one (fails every request that
    quotes a line starting with "q") and one that is down. The flaky engine runs one request per
    batch: a failure that takes its whole micro-batch along would fail a number of samples that
    depends on how many arrived together, which varies with the machine's speed."""
    from genrm_serve.app import build_app, deploy, wait_until_healthy
    from genrm_serve.config import build_instances
    from genrm_serve.serve_args import ServeArgs

    replies = {f"| {c}": "1" for c in FIRST_CHARS}
    instances = build_instances(
        instances={
            "__default__": {
                "model_path": scripted_model_path(default="0", replies=replies),
                "num_gpus": 1,
            },
            "flaky": {
                "model_path": scripted_model_path(
                    default="0", replies=replies, fail_when_contains="| q"
                ),
                "num_gpus": 1,
                "engine_config": {"max_batch_size": 1},
            },
            "down": {"model_path": scripted_model_path(default="1", fail_every=1), "num_gpus": 1},
        },
        engine="scripted",
    )
    old = {k: os.environ.get(k) for k in ("GENRM_URL", "GENRM_MAX_RETRIES")}
    with local_ray_serve(num_cpus=2) as port:
        try:
            args = ServeArgs(port=port, api_key=None, engine_num_cpus=0.1)
            deploy(build_app(instances, args=args), args)
            wait_until_healthy(args, 120)
            os.environ["GENRM_URL"] = args.url
            os.environ["GENRM_MAX_RETRIES"] = "0"
            yield args.url
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


async def _trainer(cfg, model_path, tokenizer, make_engine, url, reward_args):
    import genrm_rewards
    from genrm_rewards.defer import score_deferred

    judge = JudgeSleeper(url, "__default__")
    engine, handle, backend, phases = await local_stack(cfg, model_path, make_engine, judge)
    if cfg.defer_reward_to_post_process:
        rewards = RewardSetup(
            args=reward_args,
            reward_key="score",
            inline_fn=None,
            batch_fn=score_deferred,
            post_process=defer_swap_post_process,
        )
    else:
        rewards = RewardSetup(
            args=reward_args,
            reward_key="score",
            inline_fn=genrm_rewards.get_reward_fn("dapo-genrm"),
        )
    trainer = make_trainer(cfg, tokenizer, handle, backend, phases, rewards)
    return trainer, engine, backend


def _cfg(tmp_path, data, **kw):
    base = dict(
        hf_checkpoint="unused",
        prompt_data=str(data),
        rm_type="dapo-genrm",
        num_rollout=2,
        rollout_batch_size=4,
        n_samples_per_prompt=4,
        rollout_max_response_len=5,
        rollout_temperature=1.5,
        lr=1e-3,
        seed=3,
        run_dir=str(tmp_path / "run"),
        genrm_model_path="scripted",  # the plan's judge; the tests use the module's service
        genrm_engine="scripted",
        # the tiny random policy is cut off at the length limit nearly every time: these tests
        # are about the judge's rewards and failures, so they train on cut-off responses
        keep_cut_off=True,
    )
    base.update(kw)
    base.setdefault("builtin_reward_post_process", base.get("defer_reward_to_post_process", False))
    return build_config(**base)


async def test_two_steps_with_judge_rewards(
    judge, tmp_path, data_file, tiny_model_path, char_tokenizer, test_engine_factory
):
    cfg = _cfg(tmp_path, data_file)
    args = SimpleNamespace(rule_gate=False, verdict_cache=False, genrm_route_key="flaky")
    trainer, engine, backend = await _trainer(
        cfg,
        tiny_model_path,
        char_tokenizer,
        test_engine_factory,
        judge,
        args,
    )
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    batches = []
    orig = trainer.finish_step

    async def spy(step, batch, *rest, **kw):
        batches.append(batch)
        await orig(step, batch, *rest, **kw)

    trainer.finish_step = spy
    await trainer.run()

    from genrm_rewards.dapo_genrm import build_messages

    samples = [s for b in batches for s in b]
    for s in samples:  # every verdict is the judge's, and it follows the script
        # the judge saw the answer quoted line by line ("| ...")
        block = build_messages("q", s.label, s.response)[0]["content"]
        if s.status == "judge_error":
            # the flaky engine fails a request that quotes a line starting with "q": this one
            assert "request contains '| q'" in s.reward_details["error"]
            assert "| q" in block
            assert s.reward is None and not s.in_loss and s.advantage == 0.0
            continue
        assert s.status == "ok" and s.reward_details["route_key"] == "flaky"
        # the script says 1 when a quoted line starts with one of FIRST_CHARS
        expected = 1.0 if any(f"| {c}" in block for c in FIRST_CHARS) else 0.0
        assert s.reward == expected, s.response
    assert {s.reward for s in samples} >= {0.0, 1.0}
    errors = [s for s in samples if s.status == "judge_error"]
    assert 0 < len(errors) < len(samples) // 2, len(errors)  # failures were met, and masked
    varied = [
        b
        for b in batches
        for g in {s.group_id for s in b}
        if len({s.reward for s in b if s.group_id == g and s.reward is not None}) > 1
    ]
    assert varied, "no group with differing rewards"
    assert all(
        s.advantage != 0.0
        for b in batches
        for s in b
        if s.reward is not None
        and len({x.reward for x in b if x.group_id == s.group_id and x.reward is not None}) > 1
    )
    assert engine.weight_version == 2
    assert any(not torch.equal(v, before[k]) for k, v in backend.model.state_dict().items())
    records = read_metrics(cfg.run_dir)
    assert [r["step"] for r in records] == [1, 2]
    judged = ("verdicts/judge", "verdicts/judge_cache", "verdicts/judge_error")
    assert all(sum(r.get(k, 0) for k in judged) == 16 for r in records)


async def test_failing_judge_masks_then_aborts(
    judge, tmp_path, data_file, tiny_model_path, char_tokenizer, test_engine_factory
):
    from rl_core.rewards import JudgeFailureError

    cfg = _cfg(tmp_path, data_file, num_rollout=1)
    args = SimpleNamespace(rule_gate=False, verdict_cache=False, genrm_route_key="down")
    trainer, _, _ = await _trainer(
        cfg,
        tiny_model_path,
        char_tokenizer,
        test_engine_factory,
        judge,
        args,
    )
    with pytest.raises(JudgeFailureError, match="16 of 16 samples have no reward"):
        await trainer.run()


async def test_defer_swap_through_the_service(
    judge, tmp_path, data_file, tiny_model_path, char_tokenizer, test_engine_factory
):
    import httpx

    cfg = _cfg(
        tmp_path, data_file, num_rollout=1, rm_type="dummy", defer_reward_to_post_process=True
    )
    args = SimpleNamespace(rule_gate=False, verdict_cache=False, deferred_rm_type="dapo-genrm")
    trainer, engine, _ = await _trainer(
        cfg,
        tiny_model_path,
        char_tokenizer,
        test_engine_factory,
        judge,
        args,
    )
    history = await trainer.run()
    log = [(p, w, a) for p, w, a in trainer.phases.log]
    assert log.index(("reward", "rollout", "sleep")) < log.index(
        ("reward", "genrm:__default__", "wake")
    )
    assert ("reward-done", "genrm:__default__", "sleep") in log
    assert history[0].metrics["verdicts/judge"] >= 1
    assert engine.state == "awake" and engine.weight_version == 1
    async with httpx.AsyncClient() as c:  # the service saw the judge sleep again
        metrics = (await c.get(f"{judge}/metrics")).text
    assert "asleep" in metrics or "sleep" in metrics
    await JudgeSleeper(judge, "__default__").wake()
