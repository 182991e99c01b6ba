"""``rl-core train`` flags → TrainConfig: presets, config files, errors that name the flag."""

import pytest
from pydantic import ValidationError

from rl_core.config import ConfigError, parse_train_args

BASE = ["--hf-checkpoint", "m", "--prompt-data", "d.jsonl", "--rm-type", "math"]


def test_original_flags_parse():
    cfg = parse_train_args(
        [
            *BASE,
            "--advantage-estimator",
            "grpo",
            "--use-kl-loss",
            "--kl-loss-coef",
            "0.01",
            "--kl-loss-type",
            "k2",
            "--eps-clip",
            "0.2",
            "--eps-clip-high",
            "0.28",
            "--use-tis",
            "--optimizer",
            "adam",
            "--lr",
            "1e-6",
            "--lr-decay-style",
            "constant",
            "--weight-decay",
            "0.1",
            "--n-samples-per-prompt",
            "8",
            "--rollout-max-response-len",
            "8192",
            "--rollout-temperature",
            "1",
            "--num-steps",
            "5",
            "--rollout-batch-size",
            "4",
            "--global-batch-size",
            "16",
            "--genrm-model-path",
            "judge",
            "--colocate",
        ]
    )
    assert (cfg.kl_loss_type, cfg.eps_clip_high, cfg.num_rollout) == ("k2", 0.28, 5)
    assert cfg.use_tis and cfg.use_kl_loss and cfg.train_batch_size == 16
    assert list(cfg.genrm_instances) == ["__default__"]
    with pytest.raises(ValidationError):  # frozen
        cfg.lr = 1.0  # type: ignore[misc]


def test_preset_and_config_file_and_cli_priority(tmp_path):
    cfg = parse_train_args(["--preset", "cpu-demo"])
    # the gate first, the judge for the rest, math-verify auditing every judged answer
    assert cfg.rm_type == "dapo-genrm" and cfg.rule_audit and cfg.rule_gate
    assert cfg.genrm_enabled and cfg.eval_before_and_after
    f = tmp_path / "c.yaml"
    f.write_text("lr: 0.5\nrollout-batch-size: 2\n")
    cfg = parse_train_args(["--preset", "cpu-demo", "--config", str(f), "--lr", "0.25"])
    assert (cfg.lr, cfg.rollout_batch_size) == (0.25, 2)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        pytest.param(["--n-samples-per-prompt", "1"], "at least 2", id="group-of-one"),
        pytest.param(["--global-batch-size", "5"], "must divide", id="global-batch"),
        pytest.param(["--eps-clip", "1.5"], "--eps-clip = 1.5", id="eps-range"),
        pytest.param(["--eps-clip-high", "0.1"], "eps-clip-high", id="eps-high-below"),
        pytest.param(["--save-interval", "2"], "needs --save", id="save-interval"),
        pytest.param(["--save-hf-dtype", "fp32"], "needs --save-hf DIR", id="save-hf-dtype"),
        pytest.param(["--rm-type", "dummy"], "defer-reward-to-post-process", id="dummy-alone"),
        # the plan refuses it, in the words of the layout (plan and train say the same)
        pytest.param(
            ["--defer-reward-to-post-process"],
            "--defer-reward-to-post-process with colocate",
            id="defer-non-dummy",
        ),
        pytest.param(["--genrm-instances", "{bad"], "genrm-instances", id="genrm-json"),
        pytest.param(
            ["--max-untrained-steps", "0"], "--max-untrained-steps = 0", id="untrained-steps"
        ),
    ],
)
def test_invalid_configs_name_the_flag(extra, match):
    with pytest.raises(ConfigError, match=match):
        parse_train_args([*BASE, *extra])


def test_cut_off_responses_are_out_of_the_loss_unless_kept(tmp_path):
    """One default (TrainConfig's field), the same from flags, a config file and the preset."""
    cfg = parse_train_args(BASE)
    assert (cfg.keep_cut_off, cfg.max_untrained_steps) == (False, 3)
    assert not parse_train_args(["--preset", "cpu-demo"]).keep_cut_off
    cfg = parse_train_args([*BASE, "--keep-cut-off", "--max-untrained-steps", "5"])
    assert (cfg.keep_cut_off, cfg.max_untrained_steps) == (True, 5)
    f = tmp_path / "c.yaml"
    f.write_text("keep-cut-off: true\n")
    assert parse_train_args([*BASE, "--config", str(f)]).keep_cut_off
    assert not parse_train_args([*BASE, "--config", str(f), "--no-keep-cut-off"]).keep_cut_off


def test_unknown_key_in_config_file(tmp_path):
    f = tmp_path / "c.json"
    f.write_text('{"learning_rate": 1}')
    with pytest.raises(ConfigError, match="unknown key 'learning_rate'"):
        parse_train_args([*BASE, "--config", str(f)])


def test_required_flags():
    with pytest.raises(ConfigError, match="--hf-checkpoint is required"):
        parse_train_args(["--prompt-data", "x", "--rm-type", "math"])


def test_the_flags_are_read_not_changed_and_the_judges_built_once():
    """Without --resource the run gets its mode's smallest layout, and the namespace keeps what
    the user gave (no --resource, no --colocate): the config, not the flags, holds the default."""
    from rl_core.config import build_parser, config_from_namespace

    ns = build_parser().parse_args([*BASE, "--genrm-model-path", "judge"])
    cfg = config_from_namespace(ns)
    assert ns.resource is None and ns.colocate is False
    assert cfg.layout.colocate and cfg.layout.resource["genrm"].total == 1
    assert cfg.genrm_instances == cfg.layout.genrm
