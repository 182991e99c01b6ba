"""A lost process the run cannot re-create ends it with one line: which, Ray's cause, the
command that resumes (``rl_core.lost``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ray.exceptions import RayActorError

from rl_core.lost import lost_process_line, resume_command

_KILLED = """The actor died unexpectedly before finishing this task.
\tclass_name: TrainWorker
\tactor_id: 0a1b
\tpid: 4242
\tname: rl-core-1f2e3d:actor-1
\tnamespace: 9c8b
\tip: 10.0.0.7
The actor is dead because it was killed by `ray.kill`."""


def test_a_killed_trainer_rank_is_named_with_its_cause_and_the_resume(tmp_path: Path) -> None:
    save = tmp_path / "ckpt"
    save.mkdir()
    (save / "latest").write_text("step_000001")
    argv = ["--preset", "cpu-demo", "--save", str(save), "--load", "old"]
    line = lost_process_line(RayActorError(error_msg=_KILLED), argv, str(save))
    assert line.startswith("lost trainer rank actor-1 (pid 4242, ip 10.0.0.7): ")
    assert "killed by `ray.kill`" in line
    assert line.endswith(f"rl-core train --preset cpu-demo --save {save} --load {save}")
    assert "\n" not in line


def test_without_a_checkpoint_it_says_there_is_none(tmp_path: Path) -> None:
    err = RayActorError(error_msg=_KILLED)
    assert lost_process_line(err, [], None).endswith("(the run had no --save)")
    assert resume_command([], str(tmp_path)) is None  # --save given, nothing written yet
    assert "none was written to" in lost_process_line(err, [], str(tmp_path))


def test_an_oom_kill_gives_the_memory_figures() -> None:
    text = (
        "Task was killed due to the node running low on memory.\nMemory on the node (IP: "
        "10.0.0.7, ID: ab) was 22.49GB used / 23.59GB limit (0.95)\n" + "detail " * 200
    )
    line = lost_process_line(RuntimeError(text), [], None)
    assert "killed by Ray's memory monitor (22.49GB used / 23.59GB limit)" in line


def test_rays_error_is_found_under_what_was_raised_from_it() -> None:
    from genrm_serve import EngineGoneError
    from rl_core.lost import lost_actor_error

    ray_err = RayActorError(error_msg=_KILLED)
    try:
        try:
            raise EngineGoneError("rollout-0", ray_err)
        except EngineGoneError as gone:
            raise TimeoutError("a deadline") from gone
    except TimeoutError as outer:
        assert lost_actor_error(outer) is ray_err
    assert lost_actor_error(ValueError("not Ray")) is None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_trainer_rank_ends_the_run_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import threading
    import time

    import ray

    from genrm_serve.testing import build_tiny_model
    from rl_core.data import make_easy_math, write_prompt_data
    from rl_core.train import main

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    model = build_tiny_model(tmp_path / "policy")
    data = write_prompt_data(tmp_path / "train.jsonl", make_easy_math(8, seed=1, shots=1))
    run_dir, save = tmp_path / "run", tmp_path / "ckpt"
    argv = [
        "--hf-checkpoint", str(model), "--prompt-data", str(data), "--rm-type", "math",
        "--num-rollout", "3", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
        "--rollout-max-response-len", "6", "--keep-cut-off", "--colocate", "--device", "cpu",
        "--run-dir", str(run_dir), "--save", str(save), "--save-interval", "1",
        "--max-restarts", "0",  # the restart from the checkpoint: test_restart_e2e.py
    ]  # fmt: skip

    def kill_rank_after_step_1() -> None:
        deadline = time.monotonic() + 500
        while time.monotonic() < deadline:
            if (save / "latest").exists():
                (name,) = [n for n in ray.util.list_named_actors() if n.endswith(":actor-0")]
                ray.kill(ray.get_actor(name))
                return
            time.sleep(0.05)

    threading.Thread(target=kill_rank_after_step_1, daemon=True).start()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith("rl-core train: lost")]
    assert line.startswith("rl-core train: lost trainer rank actor-0 (")
    assert "ray.kill" in line
    assert "; no restart (--max-restarts 0); resume from the last checkpoint with: " in line
    assert line.endswith(f"--load {save}")


def test_an_engine_ray_cannot_reach_is_named_by_the_engine_around_it() -> None:
    """A node that went away: Ray's first error knows only the actor's id, and says "may or
    may not have been executed"; the line names the engine and says what Ray could not do."""
    from ray.exceptions import ActorUnavailableError

    from genrm_serve import EngineGoneError
    from rl_core.lost import lost_process_what

    ray_err = ActorUnavailableError(
        "The actor is temporarily unavailable: RpcError: RPC error: Socket closed rpc_code: 14. "
        "The task may or may not have been executed on the actor.",
        b"\x99" * 16,
    )
    try:
        raise EngineGoneError("rollout-0", ray_err)
    except EngineGoneError as gone:
        what = lost_process_what(ray_err, gone)
    assert what == (
        "lost engine rollout-0: Ray cannot reach it (its node is down or cut off): "
        "RpcError: RPC error: Socket closed"
    )


async def test_a_step_that_failed_on_its_own_finds_the_process_lost_behind_it() -> None:
    """A node gone: the judge's 503s may end the step before any call to a trainer rank or the
    rollout engine fails. Asked, the gone one answers with Ray's error (a busy one is not
    gone); the line then names it as if Ray's error had come first."""
    import asyncio
    from types import SimpleNamespace

    from ray.exceptions import ActorUnavailableError

    from rl_core.lost import ProcessLostError, find_lost_actor, lost_process_what

    gone = ActorUnavailableError("The actor is temporarily unavailable: RpcError: x", None)

    def actor(answer: str) -> Any:
        async def ready() -> None:
            if answer == "gone":
                raise gone
            if answer == "busy":
                await asyncio.sleep(5)

        return SimpleNamespace(__ray_ready__=SimpleNamespace(remote=ready))

    actors = [("actor-0", actor("busy")), ("actor-1", actor("gone"))]
    assert await find_lost_actor(actors, 0.2) == ("actor-1", gone)
    assert await find_lost_actor(actors[:1], 0.2) is None
    try:
        raise ProcessLostError(
            "JudgeFailureError: step 2: 8 of 8 samples", "trainer rank", "actor-1"
        ) from gone
    except ProcessLostError as err:
        what = lost_process_what(gone, err)
    assert what.startswith("lost trainer rank actor-1: Ray cannot reach it")
