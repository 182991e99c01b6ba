"""A trainer rank killed mid-run restarts the run from its last checkpoint, by itself, and the
run ends as an undisturbed one does (``rl_core.restarts``, ``--max-restarts``).

``rl-core train`` from flags, in this process (local Ray, the judge service with the scripted
engine, the hf rollout engine on a tiny model, two trainer ranks, colocated, ``--save`` every
step). Once step 1's checkpoint is written (and, in the chaos runs, after a seeded random delay
more), trainer rank ``actor-1`` is killed (``ray.kill``, as an OOM kill or a preemption ends
it). The driver tears the run down, builds it again on the same Ray and goes on from the last
checkpoint: steps 1..N are recorded once each (``metrics.jsonl``, ``samples/``, TensorBoard),
the step after the restart says what was lost, and the final weights are bitwise those of a run
with the same seed that nothing disturbed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from restart_reward import restart_run_argv
from run_records import tb_scalars

from rl_core.checkpoints import latest_step
from rl_core.config import parse_train_args
from rl_core.data import make_easy_math, write_prompt_data
from rl_core.launch import run_training
from rl_core.metrics import logged_steps, read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 4
#: what must be equal, step by step, between the restarted run and the undisturbed one
_SAME = ("rollout/", "train/", "adv/", "weights/version")


def _argv(root: Path, model: Path, data: Path, name: str, *extra: str) -> list[str]:
    return restart_run_argv(root, model, data, name, STEPS, *extra)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from genrm_serve.testing import build_tiny_model

    root = tmp_path_factory.mktemp("restart")
    return {
        "root": root,
        "model": build_tiny_model(root / "policy"),
        "data": write_prompt_data(root / "train.jsonl", make_easy_math(8, seed=1, shots=1)),
    }


@pytest.fixture(scope="module", autouse=True)
def _no_cuda() -> Iterator[None]:
    """Every run of this file computes on CPU; the variable is put back after the file (a
    leaked empty value made Ray refuse the logical GPUs of later files' clusters)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "")
        yield


@pytest.fixture(scope="module")
def undisturbed(files: dict[str, Path], shared_ray: None) -> Path:
    """The root of a run with the same flags that nothing disturbed."""
    cfg = parse_train_args(_argv(files["root"], files["model"], files["data"], "undisturbed"))
    assert asyncio.run(run_training(cfg)) == 0
    return files["root"] / "undisturbed"


async def _kill_a_rank(
    save: Path, delay_s: float, killed: list[str], after_step: int | None = None
) -> None:
    """``actor-1`` killed once step 1's checkpoint is written (or, with ``after_step``, once
    that step is recorded) and ``delay_s`` more has passed; not once the last step's checkpoint
    is written: a finished run has nothing left to lose."""
    import ray

    for _ in range(18_000):  # polled every 50 ms, up to the test's 15 minutes
        if after_step is None and latest_step(save) >= 1:
            break
        if after_step is not None and after_step in logged_steps(save.parent / "run"):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(delay_s)
    if latest_step(save) == STEPS:
        return
    (name,) = [n for n in ray.util.list_named_actors() if n.endswith(":actor-1")]
    layout = save.parent / "run" / "layout.json"  # the attempt's actors, as the kill finds them
    (save.parent / "layout-at-kill.json").write_text(layout.read_text())
    ray.kill(ray.get_actor(name))
    killed.append(name)


def _actor_ids(layout: Path) -> dict[str, set[str]]:
    """The actors of a run's layout record, by role."""
    ids: dict[str, set[str]] = {}
    for actor in json.loads(layout.read_text())["actors"]:
        ids.setdefault(actor["role"], set()).add(actor["actor_id"])
    return ids


def _weights(run: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    folder = run / "ckpt" / f"step_{STEPS:06d}" / "model"
    tensors: dict[str, Any] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors |= load_file(path)
    assert tensors, f"no weights in {folder}"
    return tensors


def _compared(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k.startswith(_SAME)}


def _samples(run: Path, step: int) -> list[tuple[Any, ...]]:
    path = run / "run" / "samples" / f"step_{step:06d}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [(r["group"], r["index"], r["response"], r["reward"], r["advantage"]) for r in rows]


async def _restarted_run(
    files: dict[str, Path],
    name: str,
    delay_s: float,
    caplog: pytest.LogCaptureFixture,
    *extra: str,
    after_step: int | None = None,
) -> tuple[Path, list[str]]:
    root = files["root"] / name
    cfg = parse_train_args(_argv(files["root"], files["model"], files["data"], name, *extra))
    caplog.set_level(logging.INFO, logger="rl_core")
    killed: list[str] = []
    killer = asyncio.ensure_future(_kill_a_rank(root / "ckpt", delay_s, killed, after_step))
    try:
        assert await run_training(cfg) == 0
    finally:
        killer.cancel()
    return root, killed


def _check_as_undisturbed(run: Path, undisturbed: Path) -> list[dict[str, Any]]:
    """Each step once, in every record, equal to the undisturbed run's; the same weights."""
    import torch

    records = read_metrics(run / "run")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    samples = sorted(p.stem for p in (run / "run" / "samples").glob("step_*.jsonl"))
    assert samples == [f"step_{s:06d}" for s in range(1, STEPS + 1)]
    for purge in (True, False):  # TensorBoard, and a reader that knows no purge rule
        scalars = tb_scalars(run / "run" / "tb", purge=purge)
        for tag in ("rollout/reward_mean", "weights/version", "run/restarts"):
            assert [s for s, _ in scalars[tag]] == list(range(1, STEPS + 1)), (tag, scalars[tag])
    before = read_metrics(undisturbed / "run")
    for got, want in zip(records, before, strict=True):
        assert _compared(got) == _compared(want), got["step"]
        assert _samples(run, got["step"]) == _samples(undisturbed, got["step"])
    weights, expected = _weights(run), _weights(undisturbed)
    assert weights.keys() == expected.keys()
    differ = [k for k in weights if not torch.equal(weights[k], expected[k])]
    assert not differ, f"{len(differ)} of {len(weights)} tensors differ, e.g. {differ[:3]}"
    base = _base_weights(run.parent)
    changed = [k for k in base.keys() & weights.keys() if not torch.equal(weights[k], base[k])]
    assert changed, "training changed no weight: the comparison would prove nothing"
    return records


def _base_weights(root: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    tensors: dict[str, Any] = {}
    for path in sorted((root / "policy").glob("*.safetensors")):
        tensors |= load_file(path)
    return tensors


async def test_a_killed_trainer_rank_restarts_the_run_from_its_checkpoint(
    files: dict[str, Path], shared_ray: None, undisturbed: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run, killed = await _restarted_run(files, "killed", 0.0, caplog)
    assert len(killed) == 1, "the trainer rank was not killed during the run"
    said = [r.getMessage() for r in caplog.records]
    restarts = [m for m in said if "restarting the run from its checkpoint of step" in m]
    assert len(restarts) == 1, said
    assert restarts[0].startswith("lost trainer rank actor-1 (pid ")
    assert "ray.kill" in restarts[0] and restarts[0].endswith("restart 1 of --max-restarts 3")
    assert any(m.startswith("restart 1 in place: ") for m in said), said
    # in place: the judge engine (and the service in front of it) is the one the kill found;
    # the trainer ranks and the rollout engine are new
    before, after = _actor_ids(run / "layout-at-kill.json"), _actor_ids(run / "run" / "layout.json")
    assert after["genrm:__default__"] == before["genrm:__default__"]
    assert not after["actor"] & before["actor"] and not after["rollout"] & before["rollout"]
    records = _check_as_undisturbed(run, undisturbed)
    # the first step recorded after the restart says what was lost and from where it went on
    (told,) = [r for r in records if "run/restarted_from_step" in r]
    assert told["step"] == told["run/restarted_from_step"] + 1
    assert told["run/lost"].startswith("lost trainer rank actor-1 (")
    assert [r["run/restarts"] for r in records] == [int(r["step"] >= told["step"]) for r in records]
    assert any(f"step {told['step']}: the run restarted from" in m for m in said), said


async def test_a_step_recorded_after_the_checkpoint_is_recorded_once(
    files: dict[str, Path], shared_ray: None, undisturbed: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``--save-interval 2``: the rank is lost once step 3 is recorded, before step 4's save;
    the restart from step 2's checkpoint redoes step 3, whose first records (a line of
    ``metrics.jsonl``, a sample file, TensorBoard events) are replaced, not added to."""
    run, killed = await _restarted_run(
        files, "after-3", 0.0, caplog, "--save-interval", "2", after_step=3
    )
    assert len(killed) == 1, "the run ended before the kill"
    said = [r.getMessage() for r in caplog.records]
    assert any("from its checkpoint of step 2 (" in m for m in said), said
    assert any("resumed from" in m and m.endswith("at step 2") for m in said), said
    records = _check_as_undisturbed(run, undisturbed)
    (told,) = [r for r in records if "run/restarted_from_step" in r]
    assert (told["step"], told["run/restarted_from_step"]) == (3, 2)


@pytest.mark.parametrize("seed", [1, 2], ids=["seed-1", "seed-2"])
async def test_chaos_a_trainer_rank_killed_at_a_random_time(
    files: dict[str, Path],
    shared_ray: None,
    undisturbed: Path,
    caplog: pytest.LogCaptureFixture,
    seed: int,
) -> None:
    """The short chaos run for this victim: the kill lands at a seeded random point after step
    1's checkpoint (rollout, training, weight sync or a save), and the run still ends as the
    undisturbed one."""
    delay = random.Random(seed).uniform(0.0, 1.0)  # steps 2-4 take about 2 s on CPU
    run, killed = await _restarted_run(files, f"chaos-{seed}", delay, caplog)
    assert len(killed) == 1, f"the run ended before the kill {delay:.2f} s after step 1's save"
    records = _check_as_undisturbed(run, undisturbed)
    assert sum(1 for r in records if "run/restarted_from_step" in r) == 1


def test_with_the_restarts_used_up_a_lost_rank_ends_the_run_with_one_line(
    files: dict[str, Path],
    shared_ray: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--max-restarts 1``: ``actor-1`` killed after step 1's checkpoint (the run restarts),
    then again as soon as the restart has made it anew: exit 1, one line, no traceback."""

    import ray

    from rl_core.train import main

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    root = files["root"] / "used-up"
    argv = _argv(files["root"], files["model"], files["data"], "used-up", "--max-restarts", "1")
    killed: list[str] = []

    def kill_twice() -> None:
        deadline = time.monotonic() + 800
        while time.monotonic() < deadline and len(killed) < 2:
            if (root / "ckpt" / "latest").exists():
                names = [n for n in ray.util.list_named_actors() if n.endswith(":actor-1")]
                for name in set(names) - set(killed):
                    with contextlib.suppress(ValueError):  # gone with its placement group
                        ray.kill(ray.get_actor(name))
                        killed.append(name)
            time.sleep(0.05)

    threading.Thread(target=kill_twice, daemon=True).start()
    assert main(argv) == 1
    assert len(killed) == 2, killed
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith("rl-core train: lost")]
    # killed as it was made: Ray says it "never ran", and knows no pid of it
    assert line.startswith("rl-core train: lost trainer rank actor-1")
    assert "killed by `ray.kill`" in line
    assert "; no restart left (1 of --max-restarts 1 used); resume from the last checkpoint" in line
    assert line.endswith(f"--load {root / 'ckpt'}")


async def test_a_lost_node_restarts_the_run_once_the_cluster_holds_it_again(
    files: dict[str, Path],
    undisturbed: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cluster of two nodes (Ray's ``cluster_utils``): the head, with CPUs only, and a node of
    two logical GPUs that holds the whole plan (trainer ranks, rollout and judge engines). That
    node is lost without warning once step 1's checkpoint is written; another one like it joins
    3 s later, as an autoscaler would add it. The restart waits for the plan to fit again,
    places it on the new node, and the run ends as the undisturbed one."""
    import ray
    from ray_clusters import logical_gpu_cluster

    ray.shutdown()  # the runs' shared one (the tests above): this run's is a cluster of two nodes
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")  # Ray hands out the nodes' logical GPUs
    name = "node-lost"
    root = files["root"] / name
    argv = _argv(files["root"], files["model"], files["data"], name, "--restart-wait-s", "120")
    cfg = parse_train_args(argv)
    caplog.set_level(logging.INFO, logger="rl_core")
    with logical_gpu_cluster(num_cpus=2, num_gpus=0) as cluster:
        node = cluster.add_node(num_cpus=2, num_gpus=2)

        removed = threading.Event()

        def lose_the_node() -> None:
            # a thread of its own: the run's blocking Ray calls may hold every thread of the
            # event loop's executor
            deadline = time.monotonic() + 600
            while not (root / "ckpt" / "latest").is_file() and time.monotonic() < deadline:
                time.sleep(0.05)
            cluster.remove_node(node, allow_graceful=False)
            removed.set()

        async def add_a_node() -> None:
            await asyncio.to_thread(removed.wait, 600)
            await asyncio.sleep(3.0)
            cluster.add_node(num_cpus=2, num_gpus=2)  # on the main thread: it sets signals

        threading.Thread(target=lose_the_node, daemon=True).start()
        adder = asyncio.ensure_future(add_a_node())
        try:
            assert await run_training(cfg) == 0
        finally:
            adder.cancel()
        assert removed.is_set() and adder.done()
    said = [r.getMessage() for r in caplog.records]
    restarts = [m for m in said if "restarting the run from its checkpoint of step" in m]
    assert len(restarts) == 1, said
    records = _check_as_undisturbed(run=root, undisturbed=undisturbed)
    assert sum(1 for r in records if "run/restarted_from_step" in r) == 1
