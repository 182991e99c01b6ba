"""``rl-core train`` preempted for real: SIGTERM to the command mid-run, then a resume.

The command runs as a user runs it (a subprocess: local Ray, the judge service over HTTP with
the scripted test engine, the hf rollout engine on a tiny random model). SIGTERM lands after the
first step is recorded; the driver must stop within 60 s with exit 143, one line saying what it
saved and no traceback, and the resume from that checkpoint must record every step exactly once.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from genrm_serve.testing import scripted_model_path
from rl_core.data import make_easy_math, write_prompt_data
from rl_core.metrics import read_metrics

pytestmark = pytest.mark.slow

STEPS = 4


def _argv(tmp_path, model, *extra):
    judge = {
        "__default__": {
            "model_path": scripted_model_path(default="1", delay_s=0.05),
            "num_gpus": 1,
            "engine": "scripted",
        }
    }
    return [
        sys.executable,
        "-m",
        "rl_core.train",
        "--hf-checkpoint",
        str(model),
        "--prompt-data",
        str(write_prompt_data(tmp_path / "train.jsonl", make_easy_math(8, seed=1, shots=1))),
        "--rm-type",
        "dapo-genrm",
        "--genrm-instances",
        json.dumps(judge),
        "--num-rollout",
        str(STEPS),
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "4",
        "--rollout-max-response-len",
        "6",
        # the tiny random policy is cut off at the limit: train on it (every step must train
        # and sync for the weight versions and the stop at --max-untrained-steps never to come)
        "--keep-cut-off",
        "--save",
        str(tmp_path / "ckpt"),
        "--save-interval",
        "2",
        "--run-dir",
        str(tmp_path / "run"),
        "--colocate",
        "--device",
        "cpu",
        *extra,
    ]


def _steps(run_dir):
    try:
        return [r["step"] for r in read_metrics(run_dir)]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def test_sigterm_mid_run_saves_and_the_resume_records_each_step_once(tmp_path):
    from genrm_serve.testing import build_tiny_model

    model = build_tiny_model(tmp_path / "policy")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        _argv(tmp_path, model), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 400
        while not _steps(run_dir) and proc.poll() is None:
            assert time.monotonic() < deadline, "no step recorded in 400 s"
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err[-3000:]
    assert took < 60, took
    assert "Traceback" not in err and "*** SIG" not in err, err[-3000:]
    done = _steps(run_dir)
    assert done and done == list(range(1, len(done) + 1)) and len(done) < STEPS, done
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"rl-core train: stopped by SIGTERM after step {done[-1]} of {STEPS}")
    assert f"step_{done[-1]:06d}" in last and "resume with --load" in last
    assert (tmp_path / "ckpt" / "latest").read_text() == f"step_{done[-1]:06d}"

    resumed = subprocess.run(
        _argv(tmp_path, model, "--load", str(tmp_path / "ckpt")),
        capture_output=True,
        text=True,
        env=env,
        timeout=500,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert [r["weights/version"] for r in records] == list(range(1, STEPS + 1))
    assert (tmp_path / "ckpt" / "latest").read_text() == f"step_{STEPS:06d}"
