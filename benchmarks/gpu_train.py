"""``rl-core train`` on one GPU, end to end: per-phase times and GPU memory per phase.

Random weights of real shapes (bf16 engines, needs a CUDA GPU): the policy is Qwen3-0.6B-shaped
(28 × 1024, MLP 3072, 16 / 8 heads, head dim 128, vocab 151,936), the judge Qwen3-4B-shaped
(36 × 2560, MLP 9728, 32 / 8 heads). Both use genrm-serve's tiny tokenizer, so texts are
nonsense and verdicts unparsed (reward 0, counted): the run measures the machinery — engines
sleeping and waking on a shared GPU, the trainer's offload / onload, weight sync — not learning.

Layouts (each its own ``rl-core train`` process, one after another):

- ``shared``: colocate-shared, ``{"actor": [1, 1], "rollout": [1, 1], "genrm": [1, 1]}``,
  rollout ``mem_fraction_static`` 0.5, judge 0.3, reward inline per sample;
- ``defer``: colocate-defer-swap on the same bundle (``--rm-type dummy``,
  ``--defer-reward-to-post-process --builtin-reward-post-process``): rollout awake with the judge
  asleep, then the judge scores the batch;
- ``megatron``: ``shared`` with ``--train-backend megatron``;
- ``sglang-shared`` / ``sglang-defer``: ``shared`` / ``defer`` with SGLang rollout and judge
  engines, 256-token responses (``--sglang-server-args`` for what the machine's SGLang needs;
  ``--judge-sleep-keeps-weights``: the judge's sleep frees its KV cache only).

Run: ``python benchmarks/gpu_train.py --out DIR [--layouts shared,defer,megatron] [--steps 3]``.
Prints a markdown report; ``DIR/gpu_train.json`` holds every step's metrics.

``--kill-trainer-after-step K``: each layout runs twice with ``--save`` every step, undisturbed
and with its trainer rank killed (``ray.kill``, as an OOM kill ends it) once step K's checkpoint
is written; the report adds the restart's log lines and its cost in wall time against the
undisturbed run, and within the killed run as the gap over the killed step against the others
(the restart in place re-creates the trainer and the rollout engine on a GPU the judge still
holds). On one H100 the ``sglang-shared`` pair takes more than 10 minutes (the undisturbed run
268 s, start-up 3 min of it): ``--killed-only`` runs the killed one alone.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_handoff import JUDGE_4B, POLICY_06B, QUICK

from rl_core.checkpoints import latest_step

RESOURCE = json.dumps({"actor": [1, 1], "rollout": [1, 1], "genrm": [1, 1]})

LAYOUTS: dict[str, list[str]] = {
    "shared": [
        "--rm-type",
        "dapo-genrm",
        "--sglang-mem-fraction-static",
        "0.5",
        "--genrm-engine-config",
        json.dumps({"mem_fraction_static": 0.3, "max_batch_size": 64}),
    ],
    "defer": [
        "--rm-type",
        "dummy",
        "--defer-reward-to-post-process",
        "--builtin-reward-post-process",
        "--genrm-engine-config",
        json.dumps({"max_batch_size": 64}),
    ],
}
LAYOUTS["megatron"] = [*LAYOUTS["shared"], "--train-backend", "megatron"]
#: SGLang rollout and judge engines (server args for this machine: --sglang-server-args)
SGLANG_LAYOUTS = ("sglang-shared", "sglang-defer")


def sglang_layout(name: str, server_args: dict[str, Any], keep_weights: bool = False) -> list[str]:
    """``shared`` / ``defer`` with SGLang engines: rollout gets ``server_args`` as the
    original's ``--sglang-*`` flags, the judge as ``engine_config.server_args`` (and
    ``sleep_keeps_weights`` when asked)."""
    base = name.removeprefix("sglang-")
    judge_config: dict[str, Any] = {"max_batch_size": 64, "server_args": server_args}
    if keep_weights:
        judge_config["sleep_keeps_weights"] = True
    if base == "shared":
        judge_config["mem_fraction_static"] = 0.3
    i = LAYOUTS[base].index("--genrm-engine-config")  # the hf judge's config is replaced
    flags = LAYOUTS[base][:i] + LAYOUTS[base][i + 2 :]
    flags += ["--genrm-engine-config", json.dumps(judge_config)]
    flags += ["--rollout-engine", "sglang", "--genrm-engine", "sglang"]
    if base == "defer":
        flags += ["--sglang-mem-fraction-static", "0.5"]
    for key, value in server_args.items():
        flags += [f"--sglang-{key.replace('_', '-')}", str(value)]
    return flags


def train_flags(
    policy: Path, judge: Path, run_dir: Path, steps: int, n: int, response_len: int = 128
) -> list[str]:
    return [
        "--hf-checkpoint",
        str(policy),
        "--genrm-model-path",
        str(judge),
        "--genrm-engine",
        "hf",
        "--rollout-engine",
        "hf",
        "--genrm-sampling-config",
        json.dumps({"max_response_len": 2, "temperature": 0.0}),
        "--resource",
        RESOURCE,
        "--colocate",
        "--prompt-data",
        "gen:easy-math",
        "--num-rollout",
        str(steps),
        "--rollout-batch-size",
        "8",
        "--n-samples-per-prompt",
        str(n),
        "--rollout-max-response-len",
        str(response_len),
        # a random policy writes to the limit: train on its cut-off responses, so every step
        # times a real train phase and weight sync (by default they would train nothing)
        "--keep-cut-off",
        "--rollout-temperature",
        "1.0",
        "--lr",
        "1e-6",
        "--bf16",
        "--max-tokens-per-gpu",
        "8192",
        "--run-dir",
        str(run_dir),
    ]


def _kill_trainer(proc: subprocess.Popen[bytes], ckpt: Path, after_step: int) -> dict[str, Any]:
    """Once step ``after_step``'s checkpoint is written, trainer rank 0 is killed from outside
    the run (this process joins its Ray as a second driver)."""
    import ray

    while latest_step(ckpt) < after_step and proc.poll() is None:
        time.sleep(0.05)
    if proc.poll() is not None:
        return {"kill": "the run ended first"}
    ray.init(address="auto", log_to_driver=False)
    try:
        for a in ray.util.list_named_actors(all_namespaces=True):
            if a["name"].endswith(":actor-0") or a["name"] == "actor-0":
                ray.kill(ray.get_actor(a["name"], namespace=a["namespace"]), no_restart=False)
                return {"killed": a["name"], "after_step": latest_step(ckpt)}
        return {"kill": "no trainer rank found"}
    finally:
        ray.shutdown()


def run_layout(
    name: str,
    policy: Path,
    judge: Path,
    out: Path,
    work: Path,
    steps: int,
    n: int,
    server_args: dict[str, Any] | None = None,
    keep_weights: bool = False,
    kill_after: int | None = None,
    saved_as: str | None = None,
) -> dict[str, Any]:
    """One ``rl-core train`` of layout ``name``; with ``saved_as``, saved every step and named
    ``name + saved_as`` (its run, checkpoint folder and log), and with ``kill_after`` too, its
    trainer rank killed after that step."""
    tag = saved_as or ""
    run_dir = work / "runs" / f"{name}{tag}"
    cmd = [sys.executable, "-m", "rl_core.cli", "train"]
    if name in SGLANG_LAYOUTS:
        cmd += train_flags(policy, judge, run_dir, steps, n, response_len=256)
        cmd += sglang_layout(name, server_args or {}, keep_weights)
    else:
        cmd += train_flags(policy, judge, run_dir, steps, n) + LAYOUTS[name]
    ckpt = work / "ckpt" / f"{name}{tag}"
    # an earlier invocation's run would be refused (its metrics) and its checkpoints met the kill
    for stale in (run_dir, ckpt):
        shutil.rmtree(stale, ignore_errors=True)
    if saved_as is not None:
        cmd += ["--save", str(ckpt), "--save-interval", "1", "--save-keep", "2"]
    log = out / f"train-{name}{tag}.log"
    t0 = time.perf_counter()
    killed: dict[str, Any] = {}
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=os.environ.copy())
        if kill_after is not None:
            killed = _kill_trainer(proc, ckpt, kill_after)
        proc.wait()
    wall = time.perf_counter() - t0
    res: dict[str, Any] = {"layout": f"{name}{tag}", "exit": proc.returncode, "wall_s": wall}
    if saved_as is not None:
        res["kill"] = killed
        res["restart_lines"] = [
            line for line in log.read_text().splitlines() if "restart" in line.lower()
        ][:10]
    metrics = run_dir / "metrics.jsonl"
    res["steps"] = (
        [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    )
    layout = run_dir / "layout.json"
    if layout.exists():
        res["layout_json"] = json.loads(layout.read_text())
    if proc.returncode != 0:
        res["log_tail"] = log.read_text()[-4000:]
    return res


def restart_report(undisturbed: dict[str, Any] | None, killed: dict[str, Any]) -> str:
    """The restart's cost twice where both runs exist: wall time against the undisturbed run,
    and, within the killed run, the gap over the killed step against the median other gap
    (the step after the kill includes the lost step's rerun, the restart and one step)."""
    steps = [s["step"] for s in killed["steps"]]
    lines = [f"### {killed['layout']}: exit {killed['exit']}, {killed['kill']}"]
    if undisturbed is not None:
        lines += [
            f"steps recorded: {steps} (undisturbed: {[s['step'] for s in undisturbed['steps']]})",
            f"wall {killed['wall_s']:.1f} s against {undisturbed['wall_s']:.1f} s undisturbed: "
            f"**{killed['wall_s'] - undisturbed['wall_s']:+.1f} s** for the kill",
        ]
    else:
        lines.append(f"steps recorded: {steps}, wall {killed['wall_s']:.1f} s")
    after = killed["kill"].get("after_step")
    # seconds from each step's record to the next one's, by the later step
    gaps = {b["step"]: b["time"] - a["time"] for a, b in itertools.pairwise(killed["steps"])}
    if after is not None and after + 1 in gaps and len(gaps) > 1:
        median = statistics.median(g for s, g in gaps.items() if s != after + 1)
        lines.append(
            f"step {after} → {after + 1}: {gaps[after + 1]:.1f} s against a median "
            f"{median:.1f} s between other steps: **{gaps[after + 1] - median:+.1f} s** "
            "for the kill, in the same run"
        )
    lines += [*(f"    {line}" for line in killed["restart_lines"]), ""]
    return "\n".join(lines)


def _cols(steps: list[dict[str, Any]], prefix: str) -> list[str]:
    return sorted({k for s in steps for k in s if k.startswith(prefix)})


def report(results: list[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        lines.append(
            f"### {r['layout']}: exit {r['exit']}, wall {r['wall_s']:.0f} s (start-up included)"
        )
        steps = r["steps"]
        if not steps:
            lines += ["", "```", r.get("log_tail", ""), "```", ""]
            continue
        for prefix, unit in (("time/", "s"), ("handoff/", "s"), ("mem/", "GB")):
            cols = _cols(steps, prefix)
            if not cols:
                continue
            lines.append("")
            lines.append("| step | " + " | ".join(f"{c} {unit}" for c in cols) + " |")
            lines.append("|---" * (len(cols) + 1) + "|")
            for s in steps:
                vals = [
                    f"{s[c]:.2f}" if isinstance(s.get(c), float) else str(s.get(c, ""))
                    for c in cols
                ]
                lines.append(f"| {s['step']} | " + " | ".join(vals) + " |")
        keys = (
            "weights/sync_path",
            "rollout/samples",
            "rollout/response_len_mean",
            "rollout/judge_errors",
        )
        last = steps[-1]
        lines.append("")
        lines.append("last step: " + ", ".join(f"{k} {last.get(k)}" for k in keys))
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="report: JSON and the runs' logs")
    ap.add_argument(
        "--work", type=Path, default=Path("/tmp/gpu_train"), help="models and run folders"
    )
    ap.add_argument("--layouts", default="shared,defer,megatron")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--quick", action="store_true", help="small shapes (to check the script)")
    ap.add_argument(
        "--sglang-server-args",
        default="{}",
        help="JSON: SGLang server arguments of the sglang-* layouts' engines (this machine's)",
    )
    ap.add_argument(
        "--judge-sleep-keeps-weights",
        dest="keep_weights",
        action="store_true",
        help="sglang-* layouts: the judge's sleep frees its KV cache, its weights stay",
    )
    ap.add_argument(
        "--kill-trainer-after-step",
        type=int,
        default=None,
        metavar="K",
        help="run each layout undisturbed and with its trainer rank killed after step K "
        "(both with --save every step)",
    )
    ap.add_argument(
        "--killed-only",
        action="store_true",
        help="with --kill-trainer-after-step: the killed run alone (its cost measured within "
        "it), for a pair that does not fit one command",
    )
    args = ap.parse_args()
    if args.killed_only and args.kill_trainer_after_step is None:
        ap.error("--killed-only: needs --kill-trainer-after-step K (the run it keeps)")
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    from genrm_serve.testing import build_random_qwen3

    t0 = time.perf_counter()
    args.work.mkdir(parents=True, exist_ok=True)
    policy = build_random_qwen3(
        args.work / "policy", **(QUICK if args.quick else POLICY_06B), seed=1
    )
    judge = build_random_qwen3(args.work / "judge", **(QUICK if args.quick else JUDGE_4B), seed=2)
    built = time.perf_counter() - t0
    doc: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "models_built_s": built,
        "command": " ".join(sys.argv),
        "results": [],
    }

    def write() -> None:
        """After each run: a command cut short still leaves what it measured."""
        (args.out / "gpu_train.json").write_text(json.dumps(doc, indent=1, default=str))

    for name in args.layouts.split(","):
        steps = 2 if name == "megatron" else args.steps
        sa = json.loads(args.sglang_server_args)
        common = (name, policy, judge, args.out, args.work, steps, args.n, sa, args.keep_weights)
        if args.kill_trainer_after_step is None:
            doc["results"].append(run_layout(*common))
            print(report(doc["results"][-1:]), flush=True)
        else:
            undisturbed = None
            if not args.killed_only:
                undisturbed = run_layout(*common, saved_as="-saved")
                doc["results"].append(undisturbed)
                print(report([undisturbed]), flush=True)
                write()
            killed = run_layout(
                *common, kill_after=args.kill_trainer_after_step, saved_as="-killed"
            )
            doc["results"].append(killed)
            print(report([killed]), flush=True)
            print(restart_report(undisturbed, killed), flush=True)
        write()


if __name__ == "__main__":
    main()
