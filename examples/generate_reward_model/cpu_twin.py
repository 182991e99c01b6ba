"""Run one of this folder's GPU scripts on a CPU machine: one command, one training step.

    python3 -m uv run --frozen --no-sync python -m examples.generate_reward_model.cpu_twin \
        run-qwen3-4B-8xgpu-colocated.sh

The *twin* of a script is the script itself, unchanged, with flags appended that shrink it to a
CPU: a tiny random policy under every model name it expects, four questions where it looks for
its data, scripted judges in place of the judge models (their verdicts are rules, so the twin
says nothing about a judge's quality), ``--device cpu`` and the smallest resource shape of its
mode. It is submitted, as on a cluster, with ``ray job submit`` to a local Ray whose 8 GPUs are
logical: Ray schedules the placement groups exactly as on 8 real ones.

What it builds (``--exp-dir``, a temporary folder by default) and the Ray it starts are its own;
with ``RAY_ADDRESS`` set it submits to that cluster instead and starts none. It prints the
training step's line and exits with the script's status, or 1 when the step trained nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parent


def scripted_judge(**kw: Any) -> str:
    """A scripted engine's model_path: replies from rules (genrm_serve.engines.scripted)."""
    return "scripted:" + json.dumps(kw)


#: the quality judge says 1 when the quoted answer is "7"; safety says 0 when the response
#: mentions a bomb
QUALITY_JUDGE = scripted_judge(default="0", replies={"| 7\n": "1"})
SAFETY_JUDGE = scripted_judge(default="1", replies={"bomb": "0"})

#: every twin's flags: CPU, the hf rollout engine, one step of 2 prompts × 2 samples
COMMON = [
    "--device", "cpu",
    "--no-bf16",
    "--rollout-engine", "hf",
    "--rollout-num-gpus-per-engine", "1",
    "--num-rollout", "1",
    "--rollout-batch-size", "2",
    "--n-samples-per-prompt", "2",
    "--global-batch-size", "4",
    "--rollout-max-response-len", "4",
    # the tiny random policy is cut off at the limit: train on it, so the twin trains and syncs
    "--keep-cut-off",
    "--max-tokens-per-gpu", "512",
    "--lr", "1e-3",
]  # fmt: skip

_JUDGE = ["--genrm-engine", "scripted", "--genrm-num-gpus-per-engine", "1"]

#: per script: the smallest resource shape of its mode, and scripted judges. The 35B split
#: script is the colocated one's layout at another size, so it has no twin of its own.
TWINS: dict[str, list[str]] = {
    "run-qwen3-4B-8xgpu-colocated.sh": [
        "--resource", '{"actor": [1, 2], "rollout": [1, 1], "genrm": [1, 1]}',
        "--genrm-model-path", QUALITY_JUDGE,
        *_JUDGE,
    ],
    "run-qwen3-4B-8xgpu-async.sh": [
        "--resource", '{"actor": [1, 1], "rollout": [1, 1], "genrm": [1, 1]}',
        "--genrm-model-path", QUALITY_JUDGE,
        *_JUDGE,
    ],
    # two bundles: every role of the swap has two ranks or engines
    "run-qwen35-35B-A3B-16xgpu-genrm-397B-defer.sh": [
        "--resource", '{"actor": [1, 2], "rollout": [1, 2], "genrm": [1, 2]}',
        "--genrm-model-path", QUALITY_JUDGE,
        *_JUDGE,
    ],
    "run-qwen3-4B-8xgpu-dual-genrm-split.sh": [
        "--resource", '{"actor": [1, 3], "rollout": [1, 1], "genrm": [1, 2]}',
        "--rollout-num-gpus", "1",
        "--genrm-instances", json.dumps({
            "quality": {"model_path": QUALITY_JUDGE, "num_gpus": 1, "engine": "scripted"},
            "safety": {
                "model_path": SAFETY_JUDGE,
                "num_gpus": 1,
                "engine": "scripted",
                "sampling_config": {"chat_template_kwargs": {"enable_thinking": False}},
            },
        }),
    ],
    # the rubric file's five criteria, each asked of both scripted judges
    "run-qwen3-4B-8xgpu-rubric-panel-split.sh": [
        "--resource", '{"actor": [1, 3], "rollout": [1, 1], "genrm": [1, 2]}',
        "--rollout-num-gpus", "1",
        "--genrm-instances", json.dumps({
            "judge_a": {"model_path": QUALITY_JUDGE, "num_gpus": 1, "engine": "scripted"},
            "judge_b": {"model_path": scripted_judge(default="1"), "num_gpus": 1,
                        "engine": "scripted"},
        }),
    ],
    # a group of the twin's 4 samples: 3 rounds meet every other response once, both orders
    "run-qwen3-4B-8xgpu-pairwise-genrm-split.sh": [
        "--resource", '{"actor": [1, 2], "rollout": [1, 1], "genrm": [1, 1]}',
        "--rollout-num-gpus", "1",
        "--n-samples-per-prompt", "4", "--global-batch-size", "8",
        "--genrm-model-path", scripted_judge(default="1"),
        *_JUDGE,
    ],
}  # fmt: skip


def twin_args(script: str) -> list[str]:
    """The flags the twin appends to ``script``."""
    if script not in TWINS:
        raise SystemExit(f"cpu_twin: no twin for {script!r}; one of: {', '.join(TWINS)}")
    return [*COMMON, *TWINS[script]]


def build_files(exp_dir: Path) -> Path:
    """The data where the scripts look and the tiny random policy under every model name."""
    from genrm_serve.testing import build_tiny_model

    exp_dir.mkdir(parents=True, exist_ok=True)
    policy = exp_dir / "tiny-policy"
    if not (policy / "config.json").exists():
        build_tiny_model(policy)
    for name in ("Qwen3-4B", "Qwen3.5-35B-A3B"):
        link = exp_dir / name
        if not link.exists():
            link.symlink_to(policy)
    for rel, n in (("dapo-math-17k/dapo-math-17k.jsonl", 4), ("aime-2024/aime-2024.jsonl", 2)):
        path = exp_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as f:
            for i in range(n):
                q = f"What is {i} + 7?"
                f.write(json.dumps({"prompt": [{"role": "user", "content": q}], "label": i + 7}))
                f.write("\n")
    return exp_dir


def env_path() -> str:
    """``ray`` and ``rl-core`` of this environment first on PATH: the job inherits Ray's."""
    return f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


@contextlib.contextmanager
def local_ray(num_gpus: int = 8, num_cpus: int = 16) -> Iterator[tuple[str, str]]:
    """A local Ray of logical GPUs that takes jobs; yields (dashboard address, Ray temp dir).

    Its own temp dir: Ray's job supervisor gives a job the cluster named in
    ``<temp dir>/ray_current_cluster``, and under the shared ``/tmp/ray`` that is whichever
    cluster any process on the machine started last (seen: a job landing on another cluster).
    Its own dashboard-agent port: every Ray node's agent serves jobs on 52365 unless told
    otherwise, and with another Ray on the machine holding that port every job submitted here
    fails with "No available agent to submit job". Only this cluster is stopped at the end.
    """
    import ray
    from ray.cluster_utils import Cluster

    from genrm_serve.testing import free_port

    os.environ["PATH"] = env_path()
    temp_dir = tempfile.mkdtemp(prefix="ray-twin-", dir="/tmp")  # short: socket paths ≤ 107
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "temp_dir": temp_dir,
            "num_cpus": num_cpus,  # logical: placement bundles reserve one each, not cores
            "num_gpus": num_gpus,
            "include_dashboard": True,
            "dashboard_port": free_port(),
            "dashboard_agent_listen_port": free_port(),
        },
    )
    # `ray start` writes this file, this in-process cluster only the default temp dir's: without
    # it a job's driver connects to another Ray of the machine
    Path(temp_dir, "ray_current_cluster").write_text(cluster.address)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        address = f"http://{cluster.webui_url}"
        wait_until_jobs_run(address, timeout_s=180)
        yield address, temp_dir
    finally:
        ray.shutdown()
        cluster.shutdown()
        if not os.environ.get("GENRM_KEEP_RAY_LOGS"):
            shutil.rmtree(temp_dir, ignore_errors=True)


def wait_until_jobs_run(address: str, timeout_s: float) -> None:
    """Submit a no-op job until one succeeds, as a user would after ``ray start``: the job API
    answers before the node's agent has registered ("No available agent to submit job")."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            job = client.submit_job(entrypoint="true")
            break
        except RuntimeError as err:
            if "No available agent" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(1)
    while (status := client.get_job_status(job)) not in {JobStatus.SUCCEEDED, JobStatus.FAILED}:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Ray at {address}: the no-op job is still {status}")
        time.sleep(0.5)
    if status != JobStatus.SUCCEEDED:
        raise RuntimeError(f"Ray at {address} cannot run jobs: {client.get_job_logs(job)}")


def run_twin(
    script: str,
    exp_dir: Path,
    ray_address: str,
    *,
    run_dir: Path | None = None,
    port: int | None = None,
    extra: Sequence[str] = (),
    timeout_s: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """``bash SCRIPT <twin flags> <extra>`` submitted to ``ray_address``; output captured."""
    from genrm_serve.testing import free_port

    env = dict(os.environ)
    env.update(
        PATH=env_path(),
        EXP_DIR=str(exp_dir),
        RAY_ADDRESS=ray_address,
        GENRM_PORT=str(port or free_port()),
        RUN_DIR=str(run_dir or exp_dir / "runs" / script.removesuffix(".sh")),
    )
    return subprocess.run(
        ["bash", str(EXAMPLE / script), *twin_args(script), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def _trained(run_dir: Path) -> dict[str, Any] | None:
    """Step 1's record when it took an optimizer step on some tokens, else None."""
    from rl_core.metrics import read_metrics

    rows = [r for r in read_metrics(run_dir) if r.get("step") == 1]
    step = rows[-1] if rows else {}
    trained = step.get("train/optimizer_steps", 0) >= 1 and step.get("train/train_tokens", 0) > 0
    return step if trained else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.generate_reward_model.cpu_twin",
        description="Run one of this folder's GPU scripts as its CPU twin (one training step).",
    )
    parser.add_argument(
        "script",
        nargs="?",
        default="run-qwen3-4B-8xgpu-colocated.sh",
        choices=list(TWINS),
        help="the script to run (default: %(default)s)",
    )
    parser.add_argument(
        "--exp-dir",
        type=Path,
        default=None,
        help="where the tiny policy, the data and the run go "
        "(default: a temporary folder, removed at the end)",
    )
    parser.epilog = "Flags after `--` go to rl-core train (the last value of a flag wins)."
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    with contextlib.ExitStack() as stack:
        if args.exp_dir is None:
            exp_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="twin-")))
        else:
            exp_dir = args.exp_dir.resolve()
        print(f"cpu twin of {args.script}: building the tiny policy and data in {exp_dir}")
        build_files(exp_dir)
        address = os.environ.get("RAY_ADDRESS")
        if not address:
            print("cpu twin: starting a local Ray with 8 logical GPUs")
            address, _ = stack.enter_context(local_ray())
        run_dir = exp_dir / "runs" / args.script.removesuffix(".sh")
        proc = run_twin(args.script, exp_dir, address, run_dir=run_dir, extra=extra)
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr)
        if proc.returncode != 0:
            return proc.returncode
        step = _trained(run_dir)
        if step is None:
            print(f"cpu twin: the step trained nothing (see {run_dir})", file=sys.stderr)
            return 1
        kept = f"run in {run_dir}" if args.exp_dir else "run removed; --exp-dir DIR keeps it"
        print(
            f"cpu twin: step 1 trained {step['train/train_tokens']:.0f} tokens "
            f"(loss {step['train/loss']:.4f}); {kept}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
