"""Rubrics and judge panels are checked before Ray starts: a missing or malformed rubric names the
file, the record and the key; a panel names instances the run has, for a reward that reads it.

The checks are called on a config built as the command line builds it (``build_config``); the
last case runs ``rl-core train``'s ``main`` to show the refusal is the command's, before Ray.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rl_core.config import ConfigError, build_config
from rl_core.judge_audit import panel_agreement
from rl_core.judge_checks import check_judge_settings
from rl_core.sample import Sample

JUDGES = json.dumps(
    {
        "strict": {"model_path": "scripted:1", "num_gpus": 1},
        "kind": {"model_path": "scripted:1", "num_gpus": 1},
    }
)
RUBRIC = [{"criterion": "Is polite", "weight": 2}, {"criterion": "Is short"}]


def _write(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _record(rubric: Any = None, **metadata: Any) -> dict[str, Any]:
    meta = dict(metadata)
    if rubric is not None:
        meta["rubric"] = rubric
    return {"prompt": "Greet me.", "label": "", "metadata": meta}


def _cfg(data: Path | str, **kw: Any) -> Any:
    values: dict[str, Any] = {
        "hf_checkpoint": "unused",
        "prompt_data": str(data),
        "rm_type": "rubric-genrm",
        "genrm_instances": JUDGES,
        "n_samples_per_prompt": 2,
        "rollout_batch_size": 2,
    }
    values.update(kw)
    return build_config(**values)


def test_records_with_valid_rubrics_pass(tmp_path: Path) -> None:
    data = _write(tmp_path / "d.jsonl", [_record(RUBRIC), _record(["Says hello"])])
    check_judge_settings(_cfg(data))


@pytest.mark.parametrize(
    ("records", "message"),
    [
        (
            [_record(RUBRIC), _record(id="r2")],
            r"d.jsonl: line 2 \(id 'r2'\): no metadata\['rubric'\] and no --rubric-path",
        ),
        (
            [_record(RUBRIC), _record([{"criterion": "x", "weight": -1}])],
            r"d.jsonl: line 2: metadata\['rubric'\]\[0\]\['weight'\] must be a finite number > 0",
        ),
        (
            [_record({"criterion": "x"})],
            r"line 1: metadata\['rubric'\] must be a non-empty list",
        ),
        (
            [_record([{"text": "x"}])],
            r"line 1: metadata\['rubric'\]\[0\] has unknown key\(s\) \['text'\]",
        ),
    ],
)
def test_a_missing_or_malformed_rubric_names_the_record_and_the_key(
    tmp_path: Path, records: list[Any], message: str
) -> None:
    data = _write(tmp_path / "d.jsonl", records)
    with pytest.raises(ConfigError, match=r"--prompt-data .*" + message):
        check_judge_settings(_cfg(data))


def test_eval_data_is_checked_too(tmp_path: Path) -> None:
    good = _write(tmp_path / "train.jsonl", [_record(RUBRIC)])
    bad = _write(tmp_path / "eval.jsonl", [_record()])
    with pytest.raises(ConfigError, match=r"--eval-prompt-data .*eval.jsonl: line 1: no metadata"):
        check_judge_settings(_cfg(good, eval_prompt_data=str(bad)))


def test_the_rubric_file_serves_records_without_one_and_is_checked(tmp_path: Path) -> None:
    data = _write(tmp_path / "d.jsonl", [_record(), _record(RUBRIC)])
    rubric = tmp_path / "rubric.json"
    rubric.write_text(json.dumps(RUBRIC))
    check_judge_settings(_cfg(data, rubric_path=str(rubric)))
    check_judge_settings(_cfg("gen:easy-math", rubric_path=str(rubric)))
    rubric.write_text(json.dumps([{"criterion": "x", "weight": 0}]))
    with pytest.raises(ConfigError, match=r"--rubric-path .*rubric.json: .*\[0\]\['weight'\]"):
        check_judge_settings(_cfg(data, rubric_path=str(rubric)))
    with pytest.raises(ConfigError, match=r"--rubric-path .*nope.json: .*cannot be read"):
        check_judge_settings(_cfg(data, rubric_path=str(tmp_path / "nope.json")))
    with pytest.raises(ConfigError, match=r"gen:easy-math: its records have no metadata"):
        check_judge_settings(_cfg("gen:easy-math"))


def test_a_rubric_key_of_its_own(tmp_path: Path) -> None:
    data = _write(tmp_path / "d.jsonl", [{"prompt": "p", "label": "", "metadata": {"c": RUBRIC}}])
    check_judge_settings(_cfg(data, rubric_key="c"))
    with pytest.raises(ConfigError, match=r"no metadata\['rubric'\]"):
        check_judge_settings(_cfg(data))


def test_other_rewards_do_not_read_rubrics(tmp_path: Path) -> None:
    data = _write(tmp_path / "d.jsonl", [{"prompt": "p", "label": "1"}])
    check_judge_settings(_cfg(data, rm_type="dapo-genrm"))


def test_a_panel_names_instances_of_the_run(tmp_path: Path) -> None:
    data = _write(tmp_path / "d.jsonl", [{"prompt": "p", "label": "1"}])
    check_judge_settings(_cfg(data, rm_type="dapo-genrm", judge_panel="strict,kind"))
    with pytest.raises(ConfigError, match=r"--judge-panel strict,harsh: no judge instance 'harsh'"):
        check_judge_settings(_cfg(data, rm_type="dapo-genrm", judge_panel="strict,harsh"))
    with pytest.raises(ConfigError, match=r"the reward 'dual-genrm' does not ask a panel"):
        check_judge_settings(_cfg(data, rm_type="dual-genrm", judge_panel="strict,kind"))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"judge_panel": "strict"}, r"--judge-panel = 'strict': .*two or more route keys"),
        ({"judge_panel": "strict,kind", "judge_panel_quorum": 3}, r"more than the 2 members"),
        ({"judge_panel_aggregate": "vote"}, r"--judge-panel-aggregate"),
        ({"rubric_min_answered_weight": 0.0}, r"--rubric-min-answered-weight"),
    ],
)
def test_bad_values_are_refused_by_the_config(
    tmp_path: Path, flags: dict[str, Any], message: str
) -> None:
    data = _write(tmp_path / "d.jsonl", [_record(RUBRIC)])
    with pytest.raises((ConfigError, SystemExit), match=message):
        _cfg(data, **flags)


def _panel_sample(agreement: dict[str, list[int]] | None) -> Sample:
    s = Sample(prompt="p", label=None, metadata={}, group_id=0)
    s.reward_details = {"details": {"panel": {"agreement": agreement}}} if agreement else {}
    return s


def test_panel_agreement_is_summed_per_pair_over_the_step() -> None:
    batch = [
        _panel_sample({"a~b": [1, 1], "a~c": [0, 1]}),
        _panel_sample({"a~b": [2, 3]}),  # a rubric: three criteria, two agreed
        _panel_sample(None),
    ]
    assert panel_agreement(batch, "rollout/") == {
        "rollout/panel_agreement/a~b": 0.75,
        "rollout/panel_compared/a~b": 4,
        "rollout/panel_agreement/a~c": 0.0,
        "rollout/panel_compared/a~c": 1,
    }
    assert panel_agreement([_panel_sample(None)], "rollout/") == {}


def test_the_command_refuses_a_malformed_rubric_before_ray_starts(
    tmp_path: Path, tiny_model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import ray

    from rl_core.train import main

    data = _write(
        tmp_path / "d.jsonl", [_record(RUBRIC), _record([{"criterion": "x", "weight": "a"}])]
    )
    argv = ["--hf-checkpoint", str(tiny_model_path), "--prompt-data", str(data)]
    argv += [
        "--rm-type",
        "rubric-genrm",
        "--genrm-instances",
        JUDGES,
        "--judge-panel",
        "strict,kind",
    ]
    argv += [
        "--n-samples-per-prompt",
        "2",
        "--rollout-batch-size",
        "2",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "line 2: metadata['rubric'][0]['weight'] must be a finite number > 0, got 'a'" in err, (
        err
    )
    assert len(err.splitlines()) == 1 and not ray.is_initialized()
