"""Rollout's SGLang server arguments: ``--sglang-config`` and ``--sglang-*`` overrides reach the
rollout engines' ``engine_config.server_args``; keys GenRM owns are refused before anything
starts, by ``rl-core plan`` as by ``rl-core train``, on a machine without SGLang."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rl_core.config import ConfigError, parse_train_args
from rl_core.placement import PlacementError
from rl_core.placement.sglang_flags import pop_sglang_overrides
from rl_core.specs import resolve_rollout_engine, rollout_seeded, rollout_spec

LAYOUT = [
    "--preset",
    "cpu-demo",
    "--resource",
    json.dumps({"actor": [1, 1], "rollout": [1, 1], "genrm": [1, 1]}),
    "--colocate",
    "--sglang-mem-fraction-static",
    "0.5",
    "--genrm-engine-config",
    json.dumps({"mem_fraction_static": 0.3}),
]


def test_overrides_are_read_as_the_original_takes_them() -> None:
    rest, found = pop_sglang_overrides(
        [
            "--lr",
            "0.1",
            "--sglang-attention-backend",
            "triton",
            "--sglang-disable-radix-cache",
            "--sglang-chunked-prefill-size=512",
            "--sglang-mem-fraction-static",
            "0.5",
        ],
        known={"--sglang-mem-fraction-static"},
    )
    assert rest == ["--lr", "0.1", "--sglang-mem-fraction-static", "0.5"]
    assert found == {
        "attention_backend": "triton",
        "disable_radix_cache": True,
        "chunked_prefill_size": 512,
    }


def test_config_file_and_overrides_reach_the_rollout_engines(tmp_path: Path) -> None:
    f = tmp_path / "sglang.yaml"
    f.write_text("attention_backend: fa3\nsampling_backend: pytorch\n")
    cfg = parse_train_args(
        [*LAYOUT, "--sglang-config", str(f), "--sglang-attention-backend", "triton"]
    )
    expected = {"attention_backend": "triton", "sampling_backend": "pytorch"}
    assert cfg.layout.rollout_server_args == expected
    spec = rollout_spec(cfg, "/policy", "sglang")
    assert spec.engine_config.server_args == expected
    # the hf engine takes no SGLang arguments: refused before anything starts
    with pytest.raises(PlacementError, match="rollout engine is hf"):
        resolve_rollout_engine(cfg)


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--sglang-tp-size", "2"], "--rollout-num-gpus-per-engine"),
        (["--sglang-enable-memory-saver", "false"], "sleep / wake"),
        (["--sglang-context-length", "9000"], "--rollout-max-response-len"),
    ],
)
def test_a_key_we_own_is_refused_by_train_and_plan_alike(flags: list[str], names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        parse_train_args([*LAYOUT, *flags])
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rl_core.cli",
            "plan",
            *LAYOUT[2:],
            "--rm-type",
            "dapo-genrm",
            "--genrm-model-path",
            "x",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and names in out.stderr, out.stderr


def test_a_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--sglang-config .*no-such\.yaml: cannot read"):
        parse_train_args([*LAYOUT, "--sglang-config", str(tmp_path / "no-such.yaml")])


def test_sglang_rollout_is_seeded_only_with_deterministic_inference() -> None:
    """SGLang refuses a seeded request without deterministic inference: an SGLang rollout gets
    no per-sample seed unless the original's --sglang-enable-deterministic-inference is given,
    which becomes the engine's own setting (not a server argument it would refuse)."""
    cfg = parse_train_args(LAYOUT)
    assert not rollout_seeded(cfg, "sglang") and rollout_seeded(cfg, "hf")
    assert not rollout_spec(cfg, "/policy", "sglang").engine_config.deterministic_inference
    cfg = parse_train_args([*LAYOUT, "--sglang-enable-deterministic-inference"])
    assert rollout_seeded(cfg, "sglang")
    spec = rollout_spec(cfg, "/policy", "sglang")
    assert spec.engine_config.deterministic_inference
    assert "enable_deterministic_inference" not in spec.engine_config.server_args
    with pytest.raises(ConfigError, match="true or false"):
        parse_train_args([*LAYOUT, "--sglang-enable-deterministic-inference", "sometimes"])
