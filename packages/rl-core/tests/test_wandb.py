"""``--use-wandb`` (``rl_core.wandb_mirror``): refused without the extra before Ray starts; in
offline mode, every metric of ``metrics.jsonl``, the samples table, the curves and the watch's
summary land in an offline W&B run, read back here from its files (as ``wandb sync`` uploads it).

The training run end to end (Ray, judge service, engines) with ``--use-wandb`` is in
``test_watch_e2e.py``; these need neither Ray nor a model.
"""

from __future__ import annotations

import json
import sys

import pytest
from wandb_files import history, offline_runs, run_info, summary, table_rows

from rl_core.config import ConfigError, parse_train_args
from rl_core.train import main

ARGS = ["--hf-checkpoint", "unused", "--prompt-data", "gen:easy-math", "--rm-type", "math"]


@pytest.fixture
def no_wandb(monkeypatch):
    """A machine without the wandb extra: ``import wandb`` fails."""
    monkeypatch.setitem(sys.modules, "wandb", None)


def test_use_wandb_without_the_extra_is_refused_before_ray(no_wandb, capsys) -> None:
    import ray

    with pytest.raises(ConfigError, match=r"pip install 'genrm-rl-core\[wandb\]'"):
        parse_train_args([*ARGS, "--use-wandb"])
    assert main([*ARGS, "--use-wandb", "--wandb-mode", "offline"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rl-core train: --use-wandb needs wandb"), err
    assert "genrm-rl-core[wandb]" in err[0]
    assert not ray.is_initialized()


def test_without_use_wandb_wandb_is_never_imported(no_wandb) -> None:
    cfg = parse_train_args(ARGS)  # no wandb installed, none asked for: fine
    assert cfg.use_wandb is False


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        pytest.param(["--wandb-project", "p"], "--wandb-project p", id="project"),
        pytest.param(["--wandb-mode", "offline"], "--wandb-mode offline", id="mode"),
        pytest.param(["--wandb-group", "g"], "--wandb-group g", id="group"),
    ],
)
def test_a_wandb_flag_without_use_wandb_is_refused(flags, named) -> None:
    with pytest.raises(ConfigError, match=f"{named} needs --use-wandb"):
        parse_train_args([*ARGS, *flags])


def test_slime_flag_names_parse() -> None:
    pytest.importorskip("wandb")
    cfg = parse_train_args(
        [
            *ARGS,
            "--use-wandb",
            "--wandb-project",
            "proj",
            "--wandb-team",
            "team",
            "--wandb-group",
            "grp",
            "--wandb-exp-name",
            "name",
            "--wandb-mode",
            "disabled",
            "--wandb-dir",
            "/tmp/wb",
        ]
    )
    assert (cfg.wandb_project, cfg.wandb_team, cfg.wandb_group) == ("proj", "team", "grp")
    assert (cfg.wandb_run_name, cfg.wandb_mode, cfg.wandb_dir) == ("name", "disabled", "/tmp/wb")


def test_an_offline_run_holds_what_the_files_hold(tmp_path, grpo_config) -> None:
    """The mirror as a run drives it: the writer's records and sample rows, then the curves."""
    pytest.importorskip("wandb")
    from rl_core.metrics import MetricsWriter, read_metrics
    from rl_core.plot import plot_run
    from rl_core.wandb_mirror import SAMPLE_COLUMNS, WandbMirror

    cfg = grpo_config(
        tmp_path, use_wandb=True, wandb_mode="offline", wandb_group="g", wandb_project="p"
    )
    run = tmp_path / "run"
    mirror = WandbMirror(cfg, run)
    writer = MetricsWriter(run, tensorboard=False, mirror=mirror)
    writer.log(0, {"eval/accuracy": 0.25, "eval/samples": 4})
    for step in (1, 2):
        writer.log(
            step,
            {
                "rollout/reward_mean": 0.5 * step,
                "rollout/samples": 2,
                "watch/false_pass_share": 0.0,
                "watch/len_reward_corr": None,  # left out, as TensorBoard leaves it out
                "weights/sync_path": "object_store",
            },
        )
        rows = [
            {
                "group": 0,
                "index": i,
                "question": "1 + 1 =",
                "label": "2",
                "response": f"Answer: {i + 1}",
                "reward": float(i == 1),
                "status": "ok",
                "source": "judge",
                "in_loss": True,
                "details": {"pred": str(int(i == 1)), "rule": "equal" if i else "not_equal"},
                "flags": [],
            }
            for i in range(2)
        ]
        writer.log_samples(f"step_{step:06d}", rows, step=step)
    figures = plot_run(run)
    mirror.log_figures(figures)
    mirror.log_summary({"watch/warnings": ["a warning"]})
    mirror.finish()

    (folder,) = offline_runs(run)
    info = run_info(folder)
    assert (info.project, info.run_group, info.display_name) == ("p", "g", "run")
    config = {item.key: json.loads(item.value_json) for item in info.config.update}
    assert config["rm_type"] == "math" and config["use_wandb"] is True
    logged = history(folder)
    assert sorted(logged) == [0, 1, 2]
    for record in read_metrics(run):  # every metric of the file, under its name, at its step
        row = logged[record["step"]]
        for key, value in record.items():
            if key != "time" and value is not None:
                assert row[key] == value, (record["step"], key)
    assert "watch/len_reward_corr" not in logged[1]
    table = table_rows(folder, logged[2]["samples"])
    assert list(table[0]) == list(SAMPLE_COLUMNS)
    assert [(r["sample"], r["reward"], r["judge reply"], r["math-verify"]) for r in table] == [
        ("g0/0", 0.0, "0", "not_equal"),
        ("g0/1", 1.0, "1", "equal"),
    ]
    assert {f"curves/{p.stem}" for p in figures} <= set(logged[2])
    assert summary(folder)["watch/warnings"] == ["a warning"]
