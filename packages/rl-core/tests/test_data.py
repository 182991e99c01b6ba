"""Prompt data loading: good records, bad records with line numbers, the demo math set."""

import json
import os
from pathlib import Path

import pytest

from rl_core.data import (
    DataError,
    PromptCursor,
    load_prompt_data,
    make_easy_math,
)

REPO = Path(__file__).resolve().parents[3]
SHARED = Path(os.environ.get("GENRM_SHARED_DIR", REPO.parent / "shared"))
if not (SHARED / "data").is_dir():
    SHARED = Path("/work/shared")


def _write(tmp_path, lines):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


GOOD_CHAT = {"prompt": [{"role": "user", "content": "1+1?"}], "label": "2"}
GOOD_STR = {"prompt": "2+2?", "label": 4}


def test_loads_chat_and_string_prompts(tmp_path):
    ds = load_prompt_data(_write(tmp_path, [GOOD_CHAT, GOOD_STR]))
    assert [r.metadata["question"] for r in ds.records] == ["1+1?", "2+2?"]
    assert [r.label for r in ds.records] == ["2", "4"]
    assert ds.records[1].metadata["label"] == "4"
    assert ds.skipped == []


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        pytest.param({"label": "1"}, "missing key 'prompt'", id="missing-input-key"),
        pytest.param({"prompt": "x"}, "missing key 'label'", id="missing-label-key"),
        pytest.param({"prompt": 3, "label": "1"}, "must be a string or a list", id="prompt-type"),
        pytest.param(
            {"prompt": [{"role": "bot", "content": "x"}], "label": "1"}, "role", id="bad-role"
        ),
        pytest.param({"prompt": "x", "label": [1]}, "'label' must be", id="label-type"),
        pytest.param("{not json", "invalid json", id="invalid-json"),
    ],
)
def test_bad_record_reported_with_line(tmp_path, bad, reason):
    path = _write(tmp_path, [GOOD_CHAT, bad, GOOD_STR])
    ds = load_prompt_data(path)
    assert len(ds) == 2
    assert len(ds.skipped) == 1
    assert ds.skipped[0].line == 2 and reason in ds.skipped[0].reason
    with pytest.raises(DataError, match=rf"d.jsonl:2: .*{reason[:10]}"):
        load_prompt_data(path, strict=True)


def test_custom_keys_and_missing_file(tmp_path):
    ds = load_prompt_data(_write(tmp_path, [{"q": "hi", "a": "x"}]), input_key="q", label_key="a")
    assert ds.records[0].label == "x"
    with pytest.raises(DataError, match="does not exist"):
        load_prompt_data(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="no usable records"):
        load_prompt_data(_write(tmp_path, [{"x": 1}]))


def test_aime_eval_set():
    path = SHARED / "data/aime-2024/aime-2024.jsonl"
    if not path.is_file() and not os.environ.get("CI"):  # CI has the shared data: required there
        pytest.skip(f"the shared data folder is absent here ({path}; set GENRM_SHARED_DIR)")
    ds = load_prompt_data(path, strict=True)
    assert len(ds) == 30
    assert ds.records[0].metadata["label"] == ds.records[0].label == "204"
    assert "Aya" in ds.records[0].metadata["question"]


def test_easy_math_deterministic_and_correct():
    a = make_easy_math(20, seed=3)
    assert a == make_easy_math(20, seed=3)
    assert a != make_easy_math(20, seed=4)
    for r in a:
        expr = r.metadata["question"].removeprefix("What is ").removesuffix("?")
        assert isinstance(r.prompt, str) and r.prompt.endswith(f"\n{expr} =")
        assert str(eval(expr)) == r.label
        lines = r.prompt.split("\n")
        assert len(lines) == 5
        for line in lines[:-1]:  # the worked examples are correct
            left, right = line.split(" = ")
            assert str(eval(left)) == right


def test_cursor_wraps_epochs_and_resumes():
    c = PromptCursor(size=5, seed=1)
    first = c.take(3) + c.take(3)
    assert sorted(first[:5]) == list(range(5))
    assert c.epoch == 1 and c.offset == 1
    resumed = PromptCursor(size=5, seed=1)
    resumed.restore(c.state())
    assert resumed.take(4) == c.take(4)
    with pytest.raises(DataError, match="seed"):
        PromptCursor(size=5, seed=2).restore(c.state())
