"""``rl-core eval``: the pass@k estimator, the refusals before anything starts, and the figure of a
training run's evaluation reproduced exactly from the same weights (end to end on Ray)."""

import json
import math
import re
from itertools import combinations

import pytest

from genrm_serve.testing import scripted_model_path
from rl_core import evaluate
from rl_core.evaluation import pass_at_k, pass_at_k_metrics, pass_k_values
from rl_core.sample import Sample

# --- pass@k ------------------------------------------------------------------------------------


def _pass_at_k_by_enumeration(n: int, c: int, k: int) -> float:
    """The definition: the share of the k-subsets of n samples (c right) with a right one."""
    right = set(range(c))
    subsets = list(combinations(range(n), k))
    return sum(1 for s in subsets if right & set(s)) / len(subsets)


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [(1, 0, 1), (1, 1, 1), (4, 1, 1), (4, 1, 2), (4, 2, 3), (5, 0, 5), (8, 3, 4), (8, 7, 2)],
    ids=lambda v: str(v),
)
def test_pass_at_k_is_the_unbiased_estimator(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_by_enumeration(n, c, k))
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_1_is_the_share_right():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)], ids=["c>n", "c<0", "k=0", "k>n"]
)
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


@pytest.mark.parametrize(
    ("n", "ks"),
    [(1, [1]), (2, [1, 2]), (4, [1, 2, 4]), (6, [1, 2, 4, 6]), (16, [1, 2, 4, 8, 16])],
    ids=lambda v: str(v),
)
def test_pass_k_values_are_powers_of_two_and_n(n, ks):
    assert pass_k_values(n) == ks


def _sample(group: int, index: int, reward: float | None) -> Sample:
    s = Sample(prompt="q", label="1", metadata={}, group_id=group, index=index)
    if reward is None:
        s.apply_reward({"score": None, "status": "judge_error", "error": "down"})
    else:
        s.apply_reward({"score": reward, "acc": int(reward)})
    return s


def test_pass_at_k_metrics_leave_judge_errors_out():
    # prompt 0: 1 of 4 right; prompt 1: 2 right, 1 wrong and a judge error (3 scored)
    samples = [_sample(0, i, r) for i, r in enumerate([1.0, 0.0, 0.0, 0.0])]
    samples += [_sample(1, i, r) for i, r in enumerate([1.0, None, 1.0, 0.0])]
    out = pass_at_k_metrics(samples, 4)
    assert out["eval/pass@1"] == pytest.approx((1 / 4 + 2 / 3) / 2)
    assert out["eval/pass@2"] == pytest.approx((pass_at_k(4, 1, 2) + pass_at_k(3, 2, 2)) / 2)
    # prompt 1 has 3 scored samples: out of pass@4, which is prompt 0's alone
    assert out["eval/pass@4"] == pytest.approx(1.0)
    assert out["eval/pass@4_prompts"] == 1


def test_the_table_shows_every_figure(tmp_path):
    from rich.console import Console

    samples = [_sample(0, i, r) for i, r in enumerate([1.0, 0.0])]
    samples += [_sample(1, i, r) for i, r in enumerate([None, 0.0])]
    metrics = {
        "eval/accuracy": 0.25,
        "eval/reward_mean": 1 / 3,
        "eval/judge_errors": 1,
        "eval/samples": 4,
        "eval/response_len_mean": 3.0,
        "eval/judge_rule_agreement": None,
        "eval/judge_rule_compared": 0,
        **pass_at_k_metrics(samples, 2),
    }
    summary = {
        "model": "m",
        "eval_prompt_data": "gen:easy-math-eval",
        "prompts": 2,
        "n_samples_per_eval_prompt": 2,
        "eval_temperature": 1.0,
        "eval_max_response_len": 4,
        "metrics": metrics,
    }
    console = Console(width=120, record=True)
    console.print(evaluate.render_eval_summary(summary, tmp_path))
    text = console.export_text()
    for shown in ("pass@1 (eval/accuracy)", "0.2500", "pass@2", "over 1 prompts", "judge errors"):
        assert shown in text, text
    assert "2 × 2 = 4" in text


# --- refusals before Ray starts ----------------------------------------------------------------


@pytest.fixture
def no_start(monkeypatch):
    """``rl-core eval`` must refuse before starting anything: running the evaluation fails."""

    def started(*args, **kwargs):
        raise AssertionError("the evaluation started despite a bad input")

    monkeypatch.setattr(evaluate, "run_eval", started)


def _args(model, data, out, *extra):
    return [
        "--hf-checkpoint",
        str(model),
        "--eval-prompt-data",
        str(data),
        "--rm-type",
        "math",
        "--out",
        str(out),
        *extra,
    ]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no-model", "--hf-checkpoint {tmp}/missing: no such folder"),
        ("not-a-model", "--hf-checkpoint {tmp}: not a model folder"),
        ("checkpoint", "give a --save folder (its latest step) or one of its step_* folders"),
        ("no-data", "--eval-prompt-data {tmp}/missing.jsonl: prompt data file"),
        ("bad-data", "--eval-prompt-data {tmp}/bad.jsonl: "),
        ("unknown-reward", "--rm-type nope: rm_type='nope'; registered:"),
        ("bad-k", "--n-samples-per-eval-prompt = 0: Input should be greater than 0"),
        ("out-not-empty", "--out {tmp}/out: exists and is not empty"),
        ("no-eval-set", "--eval-prompt-data is required"),
    ],
)
def test_bad_input_is_refused_in_one_line(
    case, message, tmp_path, tiny_model_path, no_start, capsys
):
    import ray

    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    model, out, extra = tiny_model_path, tmp_path / "out", []
    if case == "no-model":
        model = tmp_path / "missing"
    elif case == "not-a-model":
        model = tmp_path
    elif case == "checkpoint":
        model = tmp_path / "ckpt"
        model.mkdir()
        (model / "latest").write_text("step_000002")
    elif case == "no-data":
        data = tmp_path / "missing.jsonl"
    elif case == "bad-data":
        data = tmp_path / "bad.jsonl"
        data.write_text("not json\n")
        extra = ["--strict-data"]
    elif case == "unknown-reward":
        extra = ["--rm-type", "nope"]
    elif case == "bad-k":
        extra = ["--n-samples-per-eval-prompt", "0"]
    elif case == "out-not-empty":
        out.mkdir()
        (out / "summary.json").write_text("{}")
    argv = _args(model, data, out, *extra)
    if case == "no-eval-set":
        argv = ["--hf-checkpoint", str(model), "--rm-type", "math"]
    assert evaluate.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rl-core eval: ")
    assert message.format(tmp=tmp_path) in err
    assert len(err.splitlines()) == 1, err
    assert not ray.is_initialized()


def test_force_writes_into_a_folder_with_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("x")
    evaluate.check_out(out, force=True)  # no error
    with pytest.raises(evaluate.ConfigError, match="not empty"):
        evaluate.check_out(out, force=False)


def _recorded_run(tmp_path, **flags):
    """A run directory with the config.json ``rl-core train`` records."""
    from rl_core.config import build_config

    cfg = build_config(
        hf_checkpoint="embedded",
        prompt_data="gen:easy-math",
        eval_prompt_data="gen:easy-math-eval",
        rm_type="math",
        colocate=True,
        **flags,
    )
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(cfg.model_dump_json(indent=1))
    return run, cfg


def test_from_run_takes_the_runs_config_and_the_model(tmp_path):
    run, recorded = _recorded_run(tmp_path, eval_temperature=0.0, eval_limit=5)
    req = evaluate.parse_eval_args(
        ["--from-run", str(run), "--hf-checkpoint", "/models/final", "--out", str(tmp_path / "o")]
    )
    assert req.cfg.hf_checkpoint == "/models/final"
    assert req.cfg.model_dump(exclude={"hf_checkpoint"}) == recorded.model_dump(
        exclude={"hf_checkpoint"}
    )
    req = evaluate.parse_eval_args(["--from-run", str(run), "--n-samples-per-eval-prompt", "4"])
    assert req.cfg.n_samples_per_eval_prompt == 4
    assert req.cfg.hf_checkpoint == "embedded"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lr", "1"], "--lr cannot be changed (the run's config decides it)"),
        (["--n-samples-per-eval-prompt", "0"], "--n-samples-per-eval-prompt = 0: Input should be"),
    ],
    ids=["a training flag", "bad k"],
)
def test_from_run_refuses_what_it_cannot_change(tmp_path, argv, message):
    run, _ = _recorded_run(tmp_path)
    with pytest.raises(evaluate.ConfigError, match="^--from-run .*" + re.escape(message)):
        evaluate.parse_eval_args(["--from-run", str(run), *argv])


def test_from_run_needs_a_run_directory(tmp_path):
    with pytest.raises(evaluate.ConfigError, match=r"no config\.json there"):
        evaluate.parse_eval_args(["--from-run", str(tmp_path)])


def test_the_cli_lists_eval():
    from rl_core.cli import SUBCOMMANDS

    assert SUBCOMMANDS["eval"].module == "rl_core.evaluate"


# --- the training run's evaluation figure, reproduced ------------------------------------------


@pytest.mark.slow
async def test_eval_reproduces_the_runs_last_eval_figure(tmp_path, monkeypatch, shared_ray):
    """A training run evaluates after its last step (greedy); ``rl-core eval --from-run`` on its
    final checkpoint (exported to a model folder on the way) gives exactly the figure the run
    logged."""
    from genrm_serve.testing import build_tiny_model
    from rl_core.config import parse_train_args
    from rl_core.data import make_easy_math, write_prompt_data
    from rl_core.launch import run_training
    from rl_core.metrics import read_metrics

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    base = build_tiny_model(tmp_path / "policy")
    train = write_prompt_data(tmp_path / "train.jsonl", make_easy_math(4, seed=1, shots=1))
    evals = write_prompt_data(tmp_path / "eval.jsonl", make_easy_math(6, seed=2, shots=1))
    # the scripted judge says 1 to some of the random policy's answers: a figure that is neither
    # 0 nor 1, so agreement on it means something
    replies = {f"| {c}": "1" for c in "aeiou02468"}
    judge = {
        "__default__": {
            "model_path": scripted_model_path(default="0", replies=replies),
            "num_gpus": 1,
            "engine": "scripted",
        }
    }
    flags = [
        "--eval-prompt-data",
        str(evals),
        "--eval-before-and-after",
        "--eval-temperature",
        "0",
        "--eval-max-response-len",
        "6",
        "--rm-type",
        "dapo-genrm",
        "--rule-audit",
        "--genrm-instances",
        json.dumps(judge),
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--rollout-max-response-len",
        "4",
        "--keep-cut-off",
        "--lr",
        "1e-2",
        "--colocate",
        "--device",
        "cpu",
    ]
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    cfg = parse_train_args(
        [
            *flags,
            "--hf-checkpoint",
            str(base),
            "--prompt-data",
            str(train),
            "--num-rollout",
            "1",
            "--save",
            str(ckpt),
            "--run-dir",
            str(run),
        ]
    )
    assert await run_training(cfg) == 0
    last = read_metrics(run)[-1]
    assert last["step"] == 1 and "eval/accuracy" in last
    out = tmp_path / "eval-out"
    # the run's own settings (its config.json), its final checkpoint (exported on the way)
    argv = ["--from-run", str(run), "--hf-checkpoint", str(ckpt), "--out", str(out)]
    req = evaluate.parse_eval_args(argv)
    evaluate.preflight_eval(req)
    summary = await evaluate.run_eval(req)
    got = summary["metrics"]
    keys = ("accuracy", "reward_mean", "samples", "judge_errors", "response_len_mean")
    audit = ("judge_rule_agreement", "judge_rule_compared", "verified_accuracy")
    for key in (f"eval/{k}" for k in (*keys, *audit)):
        assert got[key] == last[key], (key, got, last)
    assert json.loads((out / "summary.json").read_text())["metrics"] == got
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    assert {"group", "question", "label", "response", "reward", "status", "source"} <= set(rows[0])
    print("reproduced:", {k: got[k] for k in got})
