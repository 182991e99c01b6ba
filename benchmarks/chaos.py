"""Chaos: one process killed at a random point of a 5-step CPU run; does the run still end whole?

Each run is ``rl-core train`` on a tiny random policy (local Ray, two trainer ranks, the hf
rollout engine, the judge service with a scripted judge that takes 0.1 s a call, colocated,
``--save`` every step, fixed seeds). Once step 1's checkpoint is written, and a seeded random
delay more (0 to 2 s: steps 2-5 take about 3 s), one process is killed (``ray.kill``, as an OOM
kill or a preemption ends it):

* ``rollout-engine``: the rollout engine's actor (re-created in its bundle);
* ``judge-engine``: the judge engine's actor (the service re-creates it);
* ``trainer-rank``: trainer rank ``actor-1`` (the run restarts from its last checkpoint);
* ``ingress``: the judge service's ingress replica (Serve starts another);
* ``controller``: Serve's controller (Ray restarts it);
* ``driver``: ``rl-core train`` itself (SIGKILL), then the same command with ``--load``.

Every run must end with steps 1-5 recorded exactly once (``metrics.jsonl``, ``samples/``), every
step with all of its 8 samples scored (none lost, no judge error), and the final weights
bitwise equal to an undisturbed run's (the settings are deterministic: seeded sampling, one
thread per process). The table says, per victim, how many runs met each rule, and what a kill
cost in wall time against the undisturbed run measured in the same invocation.

    python benchmarks/chaos.py run --seeds 5        # 6 victims x 5 seeds + 1 undisturbed run
    python benchmarks/chaos.py run --victims trainer-rank --seeds 2
    python benchmarks/chaos.py report               # the table of runs/chaos/results.jsonl

The short version (a trainer rank at two seeded times) is in the test suite,
``packages/rl-core/tests/test_restart_e2e.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rl_core.checkpoints import latest_step

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: where the run of the restart tests lives (``restart_reward``: its flags, and its reward, which
#: asks the judge about every sample and varies inside a group, so every step moves the weights)
REWARD_DIR = ROOT / "packages" / "rl-core" / "tests"
sys.path.insert(0, str(REWARD_DIR))
RUNS = ROOT / "runs" / "chaos"
STEPS = 5
SAMPLES_PER_STEP = 8  # 2 prompts x 4 samples
MAX_DELAY_S = 2.0
VICTIMS = ("rollout-engine", "judge-engine", "trainer-rank", "ingress", "controller", "driver")
#: Ray actor names (regex on "namespace/name") of each in-process victim
_NAMES = {
    "rollout-engine": r":rollout-0(-r\d+)?$",
    "judge-engine": r":genrm-.*-\d+$",
    "trainer-rank": r":actor-1$",
    "ingress": r"^serve/SERVE_REPLICA::.*GenRMIngress",
    "controller": r"^serve/SERVE_CONTROLLER_ACTOR$",
}

for key, value in {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    "CUDA_VISIBLE_DEVICES": "",
}.items():
    os.environ.setdefault(key, value)


def _argv(root: Path, name: str) -> list[str]:
    from restart_reward import restart_run_argv

    return restart_run_argv(root, root / "policy", root / "train.jsonl", name, STEPS)


def _prepare(root: Path) -> None:
    from genrm_serve.testing import build_tiny_model
    from rl_core.data import make_easy_math, write_prompt_data

    if not (root / "policy").is_dir():
        build_tiny_model(root / "policy")
    write_prompt_data(root / "train.jsonl", make_easy_math(8, seed=1, shots=1))


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return os.environ | {"PYTHONPATH": str(REWARD_DIR) + (os.pathsep + path if path else "")}


async def _kill_in_process(victim: str, ckpt: Path, delay_s: float, out: dict[str, Any]) -> None:
    import ray

    for _ in range(12_000):  # polled every 50 ms, for up to 10 minutes
        if latest_step(ckpt) >= 1:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(delay_s)
    if latest_step(ckpt) >= STEPS:
        return  # the run was done: nothing left to lose
    pattern = re.compile(_NAMES[victim])
    actors = ray.util.list_named_actors(all_namespaces=True)
    found = [a for a in actors if pattern.search(f"{a['namespace']}/{a['name']}")]
    if not found:
        out["kill"] = f"no actor matched {_NAMES[victim]}: " + ", ".join(
            f"{a['namespace']}/{a['name']}" for a in actors
        )
        return
    target = found[0]
    ray.kill(ray.get_actor(target["name"], namespace=target["namespace"]), no_restart=False)
    out |= {"killed": target["name"], "after_step": latest_step(ckpt)}


def _run_in_process(root: Path, name: str, victim: str | None, delay_s: float) -> dict[str, Any]:
    from rl_core.config import parse_train_args
    from rl_core.launch import run_training

    cfg = parse_train_args(_argv(root, name))
    out: dict[str, Any] = {}

    async def go() -> int:
        killer = (
            asyncio.ensure_future(_kill_in_process(victim, root / name / "ckpt", delay_s, out))
            if victim
            else None
        )
        try:
            return await run_training(cfg)
        finally:
            if killer is not None:
                killer.cancel()

    t0 = time.monotonic()
    try:
        out["status"] = asyncio.run(go())
    except Exception as err:  # the run's failure is a result of the benchmark, not its end
        out["status"] = f"{type(err).__name__}: {err}"[:500]
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out


def _run_driver_victim(root: Path, name: str, delay_s: float) -> dict[str, Any]:
    argv = ["rl-core", "train", *_argv(root, name)]
    ckpt = root / name / "ckpt"
    log = (root / name).with_suffix(".log").open("w")
    out: dict[str, Any] = {}
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=_env(), stdout=log, stderr=log, start_new_session=True)
    while latest_step(ckpt) < 1 and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(delay_s)
    if proc.poll() is None and latest_step(ckpt) < STEPS:
        out["after_step"] = latest_step(ckpt)
        os.kill(proc.pid, signal.SIGKILL)
        out["killed"] = f"rl-core train (pid {proc.pid})"
    proc.wait()
    if "killed" in out:
        # what the killed driver started (its local Ray) goes with its session
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        resumed = subprocess.run([*argv, "--load", str(ckpt)], env=_env(), stdout=log, stderr=log)
        out["status"] = resumed.returncode
    else:
        out["status"] = proc.returncode
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out


def _weights(run: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    tensors: dict[str, Any] = {}
    for path in sorted((run / "ckpt" / f"step_{STEPS:06d}" / "model").glob("*.safetensors")):
        tensors |= load_file(path)
    return tensors


def _check(run: Path, undisturbed: Path | None) -> dict[str, Any]:
    """The rules of a whole run: each step once, no sample lost, the undisturbed weights."""
    import torch

    from rl_core.metrics import read_metrics

    records = read_metrics(run / "run") if (run / "run" / "metrics.jsonl").is_file() else []
    steps = [int(r["step"]) for r in records]
    files = sorted((run / "run" / "samples").glob("step_*.jsonl"))
    lost = 0
    for step in range(1, STEPS + 1):
        path = run / "run" / "samples" / f"step_{step:06d}.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
        scored = {(r["group"], r["index"]) for r in rows if r.get("status", "ok") == "ok"}
        lost += SAMPLES_PER_STEP - len(scored)
    out: dict[str, Any] = {
        "steps_once": steps == list(range(1, STEPS + 1))
        and [p.stem for p in files] == [f"step_{s:06d}" for s in range(1, STEPS + 1)],
        "samples_lost": lost,
        "judge_errors": sum(int(r.get("rollout/judge_errors", 0)) for r in records),
        "restarts": int(records[-1].get("run/restarts", 0)) if records else None,
        "engine_restarts": sum(int(r.get("rollout/engine_restarts", 0)) for r in records),
    }
    if undisturbed is not None:
        got, want = _weights(run), _weights(undisturbed)
        out["weights_equal"] = (
            bool(got)
            and got.keys() == want.keys()
            and all(torch.equal(got[k], want[k]) for k in want)
        )
    return out


def _fresh(root: Path, name: str) -> str:
    """A run's folder emptied first: an earlier invocation's run, checkpoints and metrics
    would make the kill wait on a step already saved and the check count steps twice."""
    shutil.rmtree(root / name, ignore_errors=True)
    return name


def run(args: argparse.Namespace) -> int:
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    _prepare(root)
    results = root / "results.jsonl"
    base = _run_in_process(root, _fresh(root, "undisturbed"), None, 0.0)
    base |= _check(root / "undisturbed", None) | {"victim": "none", "seed": 0}
    print(json.dumps(base), flush=True)
    with results.open("w") as f:
        f.write(json.dumps(base) + "\n")
        for victim in args.victims:
            for seed in range(1, args.seeds + 1):
                delay = random.Random(f"{victim}-{seed}").uniform(0.0, MAX_DELAY_S)
                name = _fresh(root, f"{victim}-s{seed}")
                if victim == "driver":
                    out = _run_driver_victim(root, name, delay)
                else:
                    out = _run_in_process(root, name, victim, delay)
                out |= {"victim": victim, "seed": seed, "delay_s": round(delay, 2)}
                out |= _check(root / name, root / "undisturbed")
                out["extra_s"] = round(out["wall_s"] - base["wall_s"], 1)
                print(json.dumps(out), flush=True)
                f.write(json.dumps(out) + "\n")
                f.flush()
    return report(args)


def report(args: argparse.Namespace) -> int:
    rows = [json.loads(x) for x in (Path(args.out) / "results.jsonl").read_text().splitlines()]
    base = next(r for r in rows if r["victim"] == "none")
    print(f"undisturbed: {base['wall_s']} s, status {base['status']}\n")
    print(
        "| victim | runs | killed mid-run | exit 0 | steps 1-5 once | samples lost | "
        "weights equal | restarts | engine re-creations | extra wall s (median) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    failed = 0
    for victim in VICTIMS:
        mine = [r for r in rows if r["victim"] == victim]
        if not mine:
            continue
        killed = sum(1 for r in mine if "killed" in r)
        ok = sum(1 for r in mine if r["status"] == 0)
        once = sum(1 for r in mine if r["steps_once"])
        lost = sum(r["samples_lost"] for r in mine)
        equal = sum(1 for r in mine if r.get("weights_equal"))
        restarts = sum(r["restarts"] or 0 for r in mine)
        engines = sum(r["engine_restarts"] for r in mine)
        extra = sorted(r["extra_s"] for r in mine)[len(mine) // 2]
        n = len(mine)
        print(
            f"| {victim} | {n} | {killed} | {ok} | {once} | {lost} | {equal} | {restarts} | "
            f"{engines} | {extra:+.1f} |"
        )
        failed += n - min(ok, once, equal) + lost
    return 1 if failed else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--seeds", type=int, default=5)
    r.add_argument("--victims", type=lambda s: s.split(","), default=list(VICTIMS))
    r.add_argument("--out", default=str(RUNS))
    sub.add_parser("report").add_argument("--out", default=str(RUNS))
    args = p.parse_args()
    return run(args) if args.cmd == "run" else report(args)


if __name__ == "__main__":
    sys.exit(main())
