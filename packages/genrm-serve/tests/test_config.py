"""The instance parser: every invalid GenRM configuration is refused before anything starts."""

import argparse
import json
import logging

import pytest

from genrm_serve.config import (
    DEFAULT_SAMPLING,
    GenRMConfigError,
    add_genrm_args,
    build_instances,
    instances_from_args,
)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_genrm_args(parser)
    return parser.parse_args(list(argv))


def test_no_flags_means_genrm_disabled() -> None:
    assert instances_from_args(_args()) == {}


def test_legacy_flags_become_default_instance_with_defaults() -> None:
    inst = instances_from_args(
        _args(
            "--genrm-model-path",
            "/m/judge",
            "--genrm-num-gpus",
            "4",
            "--genrm-num-gpus-per-engine",
            "2",
        )
    )
    spec = inst["__default__"]
    assert (spec.model_path, spec.num_gpus, spec.num_gpus_per_engine, spec.num_engines) == (
        "/m/judge",
        4,
        2,
        2,
    )
    assert spec.sampling_config == DEFAULT_SAMPLING
    assert (spec.sampling_config.temperature, spec.sampling_config.top_k) == (0.1, -1)
    assert spec.sampling_config.max_response_len == 4096
    ec = spec.engine_config
    assert (ec.max_context_len, ec.dp_size, ec.pp_size, ec.ep_size) == (8192, 1, 1, 1)
    assert ec.mem_fraction_static is None


def test_instances_inherit_global_configs_and_override_per_key() -> None:
    inst = build_instances(
        instances=json.dumps(
            {
                "quality": {
                    "model_path": "/q",
                    "num_gpus": 2,
                    "sampling_config": {"temperature": 0.0},
                },
                "safety": {
                    "model_path": "/s",
                    "num_gpus": 1,
                    "engine_config": {"max_context_len": 4096},
                },
            }
        ),
        engine_config='{"mem_fraction_static": 0.3}',
        sampling_config=json.dumps(
            {"max_response_len": 16, "chat_template_kwargs": {"enable_thinking": False}}
        ),
    )
    q, s = inst["quality"], inst["safety"]
    assert q.sampling_config.temperature == 0.0
    assert q.sampling_config.max_response_len == 16
    assert q.sampling_config.chat_template_kwargs == {"enable_thinking": False}
    assert q.engine_config.mem_fraction_static == 0.3
    assert s.sampling_config.temperature == 0.1
    assert (s.engine_config.max_context_len, s.engine_config.mem_fraction_static) == (4096, 0.3)


def test_instances_win_over_legacy_with_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        inst = build_instances(
            instances='{"a": {"model_path": "/a", "num_gpus": 1}}', model_path="/legacy"
        )
    assert list(inst) == ["a"]
    assert "--genrm-model-path" in caplog.text


@pytest.mark.parametrize(
    ("instances", "kwargs", "message"),
    [
        pytest.param(
            {"q": {"model_path": "/q"}},
            {},
            "genrm instance 'q': missing required key 'num_gpus'",
            id="missing-num-gpus",
        ),
        pytest.param(
            {"q": {"num_gpus": 1}}, {}, "missing required key 'model_path'", id="missing-model-path"
        ),
        pytest.param(
            {"q": {"model_path": "/q", "num_gpus": 3, "num_gpus_per_engine": 2}},
            {},
            "num_gpus=3 must be a multiple of num_gpus_per_engine=2",
            id="not-multiple",
        ),
        pytest.param(
            {"q": {"model_path": "/q", "num_gpus": 0}},
            {},
            "num_gpus=0 must be a positive integer",
            id="zero-gpus",
        ),
        pytest.param(
            {"q": {"model_path": "/q", "num_gpus": 2, "num_gpus_per_engine": -1}},
            {},
            "num_gpus_per_engine=-1 must be a positive integer",
            id="negative-per-engine",
        ),
        pytest.param(
            {"q": {"model_path": "/q", "num_gpus": 1.5}},
            {},
            "num_gpus=1.5 must be an integer",
            id="float-gpus",
        ),
        pytest.param(
            {
                "q": {
                    "model_path": "/q",
                    "num_gpus": 1,
                    "engine_config": {"max_context_length": 4096},
                }
            },
            {},
            "unknown engine_config key 'max_context_length'",
            id="unknown-engine-key",
        ),
        pytest.param(
            {"q": {"model_path": "/q", "num_gpus": 1, "sampling_config": {"max_tokens": 4}}},
            {},
            "unknown sampling_config key 'max_tokens'",
            id="unknown-sampling-key",
        ),
        pytest.param(
            {"q": {"model_path": "/q", "num_gpus": 1, "engine_config": {"max_context_len": 0}}},
            {},
            "engine_config key 'max_context_len'=0",
            id="non-positive-context",
        ),
        pytest.param(
            {
                "q": {
                    "model_path": "/q",
                    "num_gpus": 1,
                    "engine_config": {"mem_fraction_static": 1.2},
                }
            },
            {},
            "mem_fraction_static'=1.2",
            id="fraction-over-one",
        ),
        pytest.param(
            {"q": {"model_path": "/q", "num_gpus": 1, "tp": 2}},
            {},
            "unknown key(s) ['tp']",
            id="unknown-instance-key",
        ),
        pytest.param(
            {"q": {"model_path": "/q", "num_gpus": 1, "engine": "vllm"}},
            {},
            "engine='vllm' is not one of",
            id="unknown-engine",
        ),
        pytest.param(
            {
                "q": {
                    "model_path": "/q",
                    "num_gpus": 1,
                    "engine_config": {"batch_wait_ms": 20, "batch_wait_max_ms": 5},
                }
            },
            {},
            "batch_wait_max_ms=5.0 is below batch_wait_ms=20.0",
            id="batch-wait-cap-below-wait",
        ),
        pytest.param({}, {}, "at least one instance", id="empty-instances"),
        pytest.param(
            {"q": {"model_path": "/q", "num_gpus": 1}},
            {"engine_config": '{"dp_size": -2}'},
            "engine_config key 'dp_size'=-2",
            id="bad-global-engine-config",
        ),
    ],
)
def test_invalid_configs_name_instance_key_value_and_rule(
    instances: dict, kwargs: dict, message: str
) -> None:
    with pytest.raises(GenRMConfigError) as err:
        build_instances(instances=json.dumps(instances), **kwargs)
    assert message in str(err.value)


def test_invalid_json_reports_position() -> None:
    with pytest.raises(
        GenRMConfigError, match=r"--genrm-instances: invalid JSON at line 1 column 8 \(char 7\)"
    ):
        build_instances(instances='{"q": {x}}')


def test_legacy_invalid_is_named_as_default_instance() -> None:
    with pytest.raises(GenRMConfigError, match="'__default__': num_gpus=3 must be a multiple"):
        build_instances(model_path="/m", num_gpus=3, num_gpus_per_engine=2)
