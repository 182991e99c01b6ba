"""What the engines of a run start as, from the config alone (no Ray, no model): the rollout
engines' spec, the judges' specs and the rollout engine ``auto`` picks."""

from __future__ import annotations

import json

import pytest

from rl_core.config import parse_train_args
from rl_core.placement import PlacementError
from rl_core.specs import judge_specs, resolve_rollout_engine, rollout_seeded, rollout_spec

FLAGS = ["--preset", "cpu-demo", "--device", "cpu"]  # an embedded judge, a split layout


def _cfg(*flags: str):  # type: ignore[no-untyped-def]
    return parse_train_args([*FLAGS, *flags])


def test_auto_is_hf_on_cpu_and_a_multi_gpu_hf_engine_is_refused() -> None:
    cfg = _cfg()
    assert cfg.layout.rollout_engine == "auto"
    assert resolve_rollout_engine(cfg) == "hf"
    wide = _cfg(
        "--resource",
        json.dumps({"actor": [1, 3], "rollout": [1, 2], "genrm": [1, 1]}),
        "--rollout-num-gpus-per-engine",
        "2",
    )
    with pytest.raises(PlacementError, match="hf rollout engine runs on one device"):
        resolve_rollout_engine(wide)


def test_the_rollout_spec_is_the_plans_engines_on_the_configured_device() -> None:
    cfg = _cfg("--n-samples-per-prompt", "3", "--rollout-max-response-len", "100", "--colocate")
    engines = cfg.plan.engines_of("rollout")
    spec = rollout_spec(cfg, "/policy", "hf")
    assert (spec.route_key, spec.model_path, spec.engine) == ("rollout", "/policy", "hf")
    assert spec.num_gpus_per_engine == len(engines[0].bundles)
    assert spec.num_gpus == spec.num_gpus_per_engine * len(engines)
    config = spec.engine_config
    assert config.device == "cpu"
    assert config.max_batch_size == 3 * 4
    assert config.max_context_len == 4096 + 100  # no --rollout-max-prompt-len
    assert config.server_args == {}  # hf: no SGLang server arguments
    assert config.mem_fraction_static == engines[0].mem_fraction_static
    assert (config.sleep_buffers == "start") is cfg.plan.sleeps("rollout")
    assert rollout_seeded(cfg, "hf")


def test_each_judge_spec_is_its_instance_with_the_plans_memory_fraction() -> None:
    cfg = _cfg("--colocate")
    specs = judge_specs(cfg)
    assert set(specs) == set(cfg.genrm_instances)
    for key, spec in specs.items():
        given = cfg.genrm_instances[key]
        assert (spec.route_key, spec.model_path) == (given.route_key, given.model_path)
        assert spec.engine_config.device == "cpu"
        fraction = cfg.plan.judges[key].mem_fraction_static
        if fraction is not None:
            assert spec.engine_config.mem_fraction_static == fraction
