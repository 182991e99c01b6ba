"""``rl-core train`` on a Ray where Serve already runs (another service, another team's apps):
Serve would keep its own proxy and ignore the run's port, so the run is refused at once, in one
line, and that Serve is left running."""

import json

import httpx
import pytest

from rl_core.data import make_easy_math, write_prompt_data

pytestmark = pytest.mark.slow


def test_a_run_where_serve_already_runs_is_refused_and_leaves_it_running(
    tmp_path, monkeypatch, capsys, tiny_run_flags, shared_ray
):
    from genrm_serve.app import shutdown_serve, start_proxy
    from genrm_serve.testing import build_tiny_model
    from rl_core.train import main

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    model = build_tiny_model(tmp_path / "policy")
    train = write_prompt_data(tmp_path / "train.jsonl", make_easy_math(4, seed=1, shots=1))
    judge = {"__default__": {"model_path": 'scripted:{"default": "1"}', "num_gpus": 1}}
    argv = [
        "--hf-checkpoint", str(model),
        "--prompt-data", str(train),
        "--rm-type", "dapo-genrm",
        "--genrm-engine", "scripted",
        "--genrm-instances", json.dumps(judge),
        *tiny_run_flags,
        "--run-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    port = start_proxy("127.0.0.1")  # the Serve that was there first
    try:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err, err[-3000:]
        (line,) = [x for x in err.splitlines() if x.startswith("rl-core train:")]
        assert f"Ray Serve already runs on this cluster, its HTTP proxy on port {port}:" in line
        assert line.endswith("shut that one down (`serve shutdown`) or use another cluster")
        # still up, its proxy answering where it did (404: no app of its own here)
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 404
    finally:
        shutdown_serve()
