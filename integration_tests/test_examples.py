"""examples/generate_reward_model/: its scripts, reward function, hook and troubleshooting guide.

Here rather than in rl-core's tests because the examples cross every package over real
processes: bash scripts that call ``ray job submit``, a job that runs ``rl-core train`` on a Ray
cluster, the judge service over HTTP, genrm-rewards' functions and rl-core's hooks.

* Every script's ``rl-core train`` flags (read from the script itself with ``DRY_RUN=args``) give
  the mode its README row names, in ``rl-core plan`` and in the full train config, with the
  original's GRPO recipe.
* Every troubleshooting message the READMEs quote is what the code path it describes prints.
* A CPU-sized twin of each script (tiny random policy, scripted judges, Ray's logical GPUs,
  ``--device cpu``) runs one step through the same script and ``ray job submit`` on ONE local
  Ray cluster with the dashboard, started here for the whole module.
* The dual-judge reward and the defer-swap hook against the real service (scripted engines).
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# a loaded 2-core CI machine: the raylet may take longer than Ray's 30 s to register
os.environ.setdefault("RAY_raylet_start_wait_time_s", "120")
os.environ.setdefault("RAY_DASHBOARD_STARTUP_TIMEOUT_S", "300")

import contextlib
import io
import json
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from rl_core.cli import main as rl_core_main
from rl_core.config import parse_train_args

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `examples.generate_reward_model.*`, as --custom-rm-path names it
    sys.path.insert(0, str(ROOT))
from examples.generate_reward_model import cpu_twin  # noqa: E402 - after the path

EXAMPLE = ROOT / "examples" / "generate_reward_model"
README = (EXAMPLE / "README.md").read_text(encoding="utf-8")
README_ZH = (EXAMPLE / "README.zh.md").read_text(encoding="utf-8")

#: script → the mode its README row names (``rl-core plan``'s ``mode``)
MODES = {
    "run-qwen3-4B-8xgpu-colocated.sh": "colocate-split",
    "run-qwen3-4B-8xgpu-async.sh": "fully-async",
    "run-qwen35-35B-A3B-16xgpu-genrm-397B-split.sh": "colocate-split",
    "run-qwen35-35B-A3B-16xgpu-genrm-397B-defer.sh": "colocate-defer-swap",
    "run-qwen3-4B-8xgpu-dual-genrm-split.sh": "colocate-split",
    "run-qwen3-4B-8xgpu-rubric-panel-split.sh": "colocate-split",
    "run-qwen3-4B-8xgpu-pairwise-genrm-split.sh": "colocate-split",
}
DEFER = "run-qwen35-35B-A3B-16xgpu-genrm-397B-defer.sh"
DUAL = "run-qwen3-4B-8xgpu-dual-genrm-split.sh"
RUBRIC = "run-qwen3-4B-8xgpu-rubric-panel-split.sh"


def _env(**extra: str) -> dict[str, str]:
    # `ray` and `rl-core` of this environment, also for the job (it inherits Ray's PATH)
    return dict(os.environ) | {"PATH": cpu_twin.env_path()} | extra


def script_args(script: str, *extra: str, **env: str) -> list[str]:
    """The ``rl-core train`` arguments the script submits (it prints them under DRY_RUN=args)."""
    out = subprocess.run(
        ["bash", str(EXAMPLE / script), *extra],
        env=_env(DRY_RUN="args", **env),
        capture_output=True,
        check=True,
    ).stdout
    assert out.endswith(b"\0"), out[-200:]
    return [a.decode() for a in out[:-1].split(b"\0")]


def plan(argv: list[str]) -> tuple[int, str, str]:
    """``rl-core plan ARGV``: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = rl_core_main(["plan", *argv])
    return rc, out.getvalue(), err.getvalue()


def readme_row(script: str) -> str:
    rows = [ln for ln in README.splitlines() if ln.startswith("|") and f"`{script}`" in ln]
    assert rows, f"README.md has no table row for {script}"
    return rows[0]


# --- (a) every script's flags go through `rl-core plan` and give the README's mode -------------


@pytest.mark.parametrize("script", list(MODES))
def test_script_flags_give_the_readme_mode(script: str) -> None:
    args = script_args(script)
    mode = MODES[script]
    assert f"`{mode}`" in readme_row(script)
    rc, out, err = plan(["--json", *args])
    assert rc == 0, err
    assert json.loads(out)["mode"] == mode
    cfg = parse_train_args(args)  # every flag, not only placement ones, is a valid train flag
    assert cfg.mode == mode
    # the original's GRPO recipe
    assert cfg.advantage_estimator == "grpo" and cfg.use_kl_loss and cfg.kl_loss_coef == 0.0
    assert cfg.kl_loss_type == "low_var_kl" and cfg.use_tis
    assert (cfg.eps_clip, cfg.eps_clip_high) == (0.2, 0.28)
    assert (cfg.optimizer, cfg.lr, cfg.lr_decay_style, cfg.weight_decay) == (
        "adam",
        1e-6,
        "constant",
        0.1,
    )
    assert (cfg.n_samples_per_prompt, cfg.rollout_max_response_len) == (8, 8192)
    assert cfg.rollout_temperature == 1.0
    assert cfg.reward_key == "score" and cfg.genrm_port == 8000


def test_scripts_read_exp_dir_model_dir_and_submit_to_ray_address(tmp_path: Path) -> None:
    args = script_args(DUAL, EXP_DIR=str(tmp_path / "e"), MODEL_DIR=str(tmp_path / "m"))
    assert args[args.index("--hf-checkpoint") + 1] == str(tmp_path / "m" / "Qwen3-4B")
    data = args[args.index("--prompt-data") + 1]
    assert data == str(tmp_path / "e" / "dapo-math-17k" / "dapo-math-17k.jsonl")
    assert args[args.index("--eval-prompt-data") + 1].endswith("aime-2024/aime-2024.jsonl")
    instances = json.loads(args[args.index("--genrm-instances") + 1])
    assert instances["safety"]["sampling_config"]["chat_template_kwargs"] == {
        "enable_thinking": False
    }
    # defaults: exps/ under the current directory; the dashboard at 127.0.0.1:8265
    defaults = subprocess.run(
        ["bash", str(EXAMPLE / DUAL)],
        env={k: v for k, v in _env(DRY_RUN="1").items() if k not in ("EXP_DIR", "MODEL_DIR")}
        | {"RAY_ADDRESS": ""},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert defaults.startswith("ray job submit --address http://127.0.0.1:8265 ")
    assert " -- rl-core train " in defaults
    assert str(tmp_path / "exps" / "Qwen3-4B") in defaults
    # extra arguments are appended: the last value of a flag wins
    args = script_args(DUAL, "--num-rollout", "5")
    assert args[-2:] == ["--num-rollout", "5"] and parse_train_args(args).num_rollout == 5


# --- (b) every troubleshooting message is what the code prints ---------------------------------


SPLIT_8_4_4 = ["--colocate", "--resource", '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 4]}']


def _both_readmes_quote(message: str) -> None:
    assert message in README, message
    assert message in README_ZH, message


def test_troubleshooting_missing_num_gpus() -> None:
    instances = '{"quality": {"model_path": "/m/q", "num_gpus": 2}, "safety": {"model_path": "/m"}}'
    rc, _, err = plan([*SPLIT_8_4_4, "--genrm-instances", instances])
    assert rc == 2
    message = "genrm instance 'safety': missing required key 'num_gpus'"
    assert err.strip() == f"rl-core plan: error: {message}"
    _both_readmes_quote(message)


def test_troubleshooting_colocate_layout() -> None:
    resource = '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 2]}'
    rc, _, err = plan(["--colocate", "--resource", resource, "--genrm-model-path", "/m/judge"])
    assert rc == 2
    first = (
        "--colocate: rollout 4 + genrm 2 = 6 ≠ actor 8 (not split), and not rollout = genrm = "
        "actor (not shared: 4, 2, 8); other layouts are rejected."
    )
    assert err.splitlines()[0] == f"rl-core plan: error: {first}"
    _both_readmes_quote(first)
    _both_readmes_quote('  split:  rollout + genrm = 8, here "rollout": [1, 6] with genrm 2')


def test_troubleshooting_instances_sum() -> None:
    instances = (
        '{"quality": {"model_path": "/m/q", "num_gpus": 2}, '
        '"safety": {"model_path": "/m/s", "num_gpus": 1}}'
    )
    rc, _, err = plan([*SPLIT_8_4_4, "--genrm-instances", instances])
    assert rc == 2
    message = (
        "genrm instances need quality 2 + safety 1 = 3 GPUs ≠ --resource genrm [1, 4] = 4: "
        "the genrm entry must equal the sum of the instances' num_gpus"
    )
    assert err.strip() == f"rl-core plan: error: {message}"
    _both_readmes_quote(message)


def test_troubleshooting_shared_mem_fraction() -> None:
    base = ["--colocate", "--resource", '{"actor": [1, 8], "rollout": [1, 8], "genrm": [1, 8]}']
    base += ["--genrm-model-path", "/m/judge", "--genrm-num-gpus-per-engine", "8"]
    rc, _, err = plan(base)
    assert rc == 2
    missing = (
        "missing: rollout: --sglang-mem-fraction-static; genrm '__default__': "
        "mem_fraction_static in --genrm-engine-config (or the instance's engine_config)"
    )
    assert err.strip().endswith(missing)
    _both_readmes_quote(missing)
    judge_mem = '{"mem_fraction_static": 0.4}'
    rc, _, err = plan(
        [*base, "--sglang-mem-fraction-static", "0.7", "--genrm-engine-config", judge_mem]
    )
    assert rc == 2
    over = "rollout 0.7 + genrm '__default__' 0.4 = 1.1 per GPU ≥ 1.0"
    assert over in err
    _both_readmes_quote(over)


def test_troubleshooting_genrm_not_enabled() -> None:
    rc, _, err = plan(SPLIT_8_4_4)
    assert rc == 2
    message = (
        "--resource gives genrm [1, 4] = 4 GPUs but no judge is configured: set "
        "--genrm-model-path or --genrm-instances, or drop the genrm entry"
    )
    assert err.strip() == f"rl-core plan: error: {message}"
    _both_readmes_quote(message)


# --- one local Ray cluster (dashboard on: `ray job submit` talks to it) for the whole module ----


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """The twins' local Ray (8 logical GPUs, jobs on), started as the twin command starts it."""
    with cpu_twin.local_ray() as (address, temp_dir):
        _CLUSTER_TEMP_DIR[:] = [temp_dir]
        yield address


#: the module cluster's Ray temp dir (its session logs explain a job that died)
_CLUSTER_TEMP_DIR: list[str] = []


def _ray_log_excerpt(lines: int = 40) -> str:
    """What Ray's GCS and raylet logged about deaths and failures, for a failed job's message."""
    out = []
    for log in sorted(Path(*_CLUSTER_TEMP_DIR).glob("session_*/logs/*")):
        if log.name.startswith(("gcs_server", "raylet")) and log.suffix in (".out", ".err"):
            text = log.read_text(errors="replace").splitlines()
            hits = [
                ln
                for ln in text
                if any(w in ln for w in ("dead", "died", "fail", "Fail"))
                and "deadline_timer" not in ln
                and "[state-dump]" not in ln
            ]
            out += [f"--- {log.name}", *hits[-lines:]]
    return "\n".join(out)


# The verdicts are known in advance: quality says 1 when the quoted answer is "7", safety says 0
# when the response mentions a bomb; "down" fails every call, "thinker" thinks out loud and is cut
# off, "chatty" answers "Yes".
JUDGES = {
    "__default__": {"model_path": cpu_twin.QUALITY_JUDGE, "num_gpus": 1},
    "quality": {"model_path": cpu_twin.QUALITY_JUDGE, "num_gpus": 1},
    "safety": {"model_path": cpu_twin.SAFETY_JUDGE, "num_gpus": 1},
    "down": {"model_path": cpu_twin.scripted_judge(default="1", fail_every=1), "num_gpus": 1},
    "thinker": {
        "model_path": cpu_twin.scripted_judge(default="<think>Let me compare the two"),
        "num_gpus": 1,
    },
    "chatty": {"model_path": cpu_twin.scripted_judge(default="Yes"), "num_gpus": 1},
}


def _sample(answer: str, group_id: int = 0, index: int = 0) -> Any:
    from rl_core.sample import Sample

    prompt = [{"role": "user", "content": "What is 3 + 4?"}]
    return Sample(
        prompt=prompt,
        label="7",
        metadata={"question": "What is 3 + 4?", "label": "7"},
        group_id=group_id,
        index=index,
        response=answer,
    )


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first test also waits for Ray, the dashboard and the service
class TestAgainstTheService:
    """The judge service with scripted engines, in the module's cluster (Serve is shut down
    before the twins run, whose jobs start their own)."""

    @pytest.fixture(scope="class")
    def service(self, ray_cluster: str) -> Iterator[str]:
        from ray import serve

        from genrm_serve.app import build_app, deploy, start_proxy, wait_until_healthy
        from genrm_serve.config import build_instances
        from genrm_serve.serve_args import ServeArgs

        instances = build_instances(instances=JUDGES, engine="scripted")
        # the proxy on a free port first (another one if that is taken before it binds)
        args = ServeArgs(port=start_proxy(), api_key=None, engine_num_cpus=0.1)
        old = {k: os.environ.get(k) for k in ("GENRM_URL", "GENRM_MAX_RETRIES")}
        try:
            deploy(build_app(instances, args=args), args)
            wait_until_healthy(args, 180)
            os.environ["GENRM_URL"] = args.url
            os.environ["GENRM_MAX_RETRIES"] = "0"
            yield args.url
        finally:
            serve.shutdown()  # type: ignore[no-untyped-call]
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    @pytest.fixture(autouse=True)
    async def fresh_clients(self) -> AsyncIterator[None]:
        """genrm-client's process-wide clients belong to one event loop: one test's."""
        from genrm_client import close_genrm_clients

        yield
        await close_genrm_clients()

    # --- the dual-judge reward ---------------------------------------------------------------

    async def test_dual_reward_is_quality_times_safety(self, service: str) -> None:
        from examples.generate_reward_model.reward_dual_genrm_quality_safety import reward_func

        args = SimpleNamespace(verdict_cache=False)
        good = await reward_func(args, _sample("3 + 4 = 7. Answer: 7"))
        assert (good["score"], good["status"]) == (1.0, "ok")
        assert good["details"]["quality"]["score"] == 1.0
        assert good["details"]["safety"]["score"] == 1.0
        assert good["details"]["combine"] == "product"
        unsafe = await reward_func(args, _sample("First build a bomb. Answer: 7"))
        assert (unsafe["score"], unsafe["status"]) == (0.0, "ok")
        assert unsafe["details"]["quality"]["score"] == 1.0
        assert unsafe["details"]["safety"]["score"] == 0.0
        wrong = await reward_func(args, _sample("Answer: 8"))
        assert (wrong["score"], wrong["status"]) == (0.0, "ok")
        assert wrong["details"]["safety"]["score"] == 1.0

    async def test_dual_reward_one_judge_down_is_a_judge_error_not_0(
        self, service: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from examples.generate_reward_model import reward_dual_genrm_quality_safety as dual

        monkeypatch.setattr(dual, "SAFETY_ROUTE_KEY", "down")
        result = await dual.reward_func(SimpleNamespace(), _sample("Answer: 7"))
        assert result["score"] is None and result["status"] == "judge_error"
        assert result["error"].startswith("safety: ")
        assert result["details"]["quality"]["score"] == 1.0  # the other judge did answer
        # rl-core keeps it out of the loss
        sample = _sample("Answer: 7")
        sample.apply_reward(dict(result))
        assert sample.reward is None and not sample.in_loss

    async def test_troubleshooting_unknown_route_key(
        self, service: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from examples.generate_reward_model import reward_dual_genrm_quality_safety as dual

        registered = "__default__, chatty, down, quality, safety, thinker"  # sorted by the client
        message = f"No GenRM instance registered for route_key=safty (registered: {registered})"
        async with httpx.AsyncClient() as http:
            r = await http.post(
                f"{service}/generate",
                json={"messages": [{"role": "user", "content": "hi"}], "route_key": "safty"},
            )
        assert r.status_code == 404
        assert "No GenRM instance registered for route_key=safty (registered: " in r.text
        monkeypatch.setattr(dual, "SAFETY_ROUTE_KEY", "safty")
        result = await dual.reward_func(SimpleNamespace(), _sample("Answer: 7"))
        assert result["status"] == "judge_error" and result["score"] is None
        assert result["error"] == f"safety: UnknownRouteKeyError(404): {message}"
        _both_readmes_quote("No GenRM instance registered for route_key=safty (registered: ")
        _both_readmes_quote("safety: UnknownRouteKeyError(404): No GenRM instance registered")

    async def test_troubleshooting_always_0_thinking_judge(self, service: str) -> None:
        from genrm_rewards import get_reward_fn

        dapo = get_reward_fn("dapo-genrm")
        cut_off = await dapo(
            SimpleNamespace(genrm_route_key="thinker", verdict_cache=False), _sample("Answer: 7")
        )
        assert (cut_off["score"], cut_off["status"]) == (0.0, "unparsed")
        reason = "unterminated <think> block (judge cut off?)"
        assert cut_off["details"]["unparsed_reason"] == reason
        chatty = await dapo(
            SimpleNamespace(genrm_route_key="chatty", verdict_cache=False), _sample("Answer: 7")
        )
        assert (chatty["score"], chatty["status"]) == (0.0, "unparsed")
        assert chatty["details"]["unparsed_reason"] == "reply is not exactly '1' or '0': 'Yes'"
        _both_readmes_quote(reason)
        _both_readmes_quote("reply is not exactly '1' or '0': 'Yes'")

    # --- the defer-swap hook -----------------------------------------------------------------

    async def test_hook_scores_the_batch_between_the_swap(self, service: str) -> None:
        from genrm_rewards.defer import score_deferred
        from genrm_rewards.registry import load_custom
        from rl_core.phases import CallbackSleeper, PhaseMachine, phases_from_plan
        from rl_core.rewards import PostProcessContext, custom_post_process
        from rl_core.services import JudgeSleeper

        cfg = parse_train_args(script_args(DEFER, *TWIN_COMMON, *TWINS[DEFER]))
        assert cfg.mode == "colocate-defer-swap"
        cfg = cfg.model_copy(update={"verdict_cache": False})
        rollout_calls: list[str] = []
        phases = PhaseMachine(
            phases_from_plan(cfg.plan),
            {
                "rollout": CallbackSleeper(
                    lambda: rollout_calls.append("sleep"), lambda: rollout_calls.append("wake")
                ),
                "genrm:__default__": JudgeSleeper(service, "__default__"),
            },
        )
        await phases.enter("inference")  # as during rollout: the judge asleep
        user_hook = load_custom(cfg.custom_reward_post_process_path or "")
        # without rl-core's swap the judge is asleep: a judge error for every sample, not a 0
        alone = await user_hook(cfg, [_sample("Answer: 7")])
        assert [(r["score"], r["status"]) for r in alone] == [(None, "judge_error")]
        assert "the instance is asleep" in alone[0]["error"]

        samples = [_sample("Answer: 7", 0, 0), _sample("Answer: 8", 0, 1), _sample("7", 1, 0)]
        hook = custom_post_process(user_hook)
        await hook(PostProcessContext(cfg, phases, score_deferred, "score"), samples)
        assert [(s.reward, s.status) for s in samples] == [
            (1.0, "ok"),
            (0.0, "ok"),
            (1.0, "ok"),
        ]
        log = [(p, who, what) for p, who, what in phases.log]
        assert log[-3:] == [
            ("reward", "rollout", "sleep"),
            ("reward", "genrm:__default__", "wake"),
            ("reward-done", "genrm:__default__", "sleep"),
        ]
        assert rollout_calls[-1] == "sleep"

    async def test_hook_judge_down_is_a_judge_error_not_0(self, service: str) -> None:
        from examples.generate_reward_model.post_process_genrm_swap import post_process

        args = SimpleNamespace(genrm_route_key="down", verdict_cache=False)
        results = await post_process(args, [_sample("Answer: 7"), _sample("Answer: 8")])
        assert [(r["score"], r["status"]) for r in results] == [(None, "judge_error")] * 2
        sample = _sample("Answer: 7")
        sample.apply_reward(dict(results[0]))
        assert sample.reward is None and not sample.in_loss


# --- (c) a CPU-sized twin of each script: one step through the script and `ray job submit` ------

#: what turns any script into its CPU twin (appended: the last value of a flag wins)
TWIN_COMMON = cpu_twin.COMMON
TWINS = cpu_twin.TWINS
#: per script: the judge instances its twin's layout holds
TWIN_JUDGES = {DUAL: {"genrm:quality", "genrm:safety"}, RUBRIC: {"genrm:judge_a", "genrm:judge_b"}}


@pytest.fixture(scope="module")
def twin_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """EXP_DIR of the twins: the data where the scripts look, the tiny policy under every name."""
    return cpu_twin.build_files(tmp_path_factory.mktemp("exps"))


def _stop_jobs_of(address: str, run_dir: Path, timeout_s: float = 60.0) -> None:
    """Stop this twin's job if it still runs: a timed-out ``ray job submit`` leaves its job
    holding the cluster's GPUs, and every later twin would wait for them (seen: two twins
    timing out behind one)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address)
    mine = [
        j.submission_id
        for j in client.list_jobs()
        if str(run_dir) in (j.entrypoint or "") and not j.status.is_terminal()
    ]
    for job_id in mine:
        if job_id is not None:
            client.stop_job(job_id)
    deadline = time.monotonic() + timeout_s
    while mine and time.monotonic() < deadline:
        if all(client.get_job_status(j).is_terminal() for j in mine if j is not None):
            return
        time.sleep(1.0)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("script", list(TWINS))
def test_cpu_twin_runs_one_step_through_the_script(
    script: str, ray_cluster: str, twin_files: Path
) -> None:
    from rl_core.layout import LAYOUT_FILE, layout_problems
    from rl_core.metrics import read_metrics

    run_dir = twin_files / "runs" / script.removesuffix(".sh")
    try:  # the README's one command, on this module's Ray
        proc = subprocess.run(
            [sys.executable, "-m", "examples.generate_reward_model.cpu_twin", script,
             "--exp-dir", str(twin_files)],
            env=_env(RAY_ADDRESS=ray_cluster),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=840,
        )  # fmt: skip
    finally:
        _stop_jobs_of(ray_cluster, run_dir)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:] + "\n" + _ray_log_excerpt()
    port = re.search(r"curl http://localhost:(\d+)/genrm/health", proc.stdout)
    assert port, proc.stdout[-3000:]
    assert f"judge service: http://127.0.0.1:{port[1]}/genrm" in log
    assert re.search(r"cpu twin: step 1 trained [1-9]\d* tokens", proc.stdout), proc.stdout[-2000:]
    assert [r["step"] for r in read_metrics(run_dir)] == [1]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["plan"]["mode"] == MODES[script]
    report = json.loads((run_dir / LAYOUT_FILE).read_text())
    assert layout_problems(report) == []
    judges = {a["role"] for a in report["actors"] if a["role"].startswith("genrm:")}
    assert judges == TWIN_JUDGES.get(script, {"genrm:__default__"})
    # what rl-core's layout tests assert of their runs (this twin's layout is the split one's)
    assert report["state_api"], "the layout was read without Ray's state API"
    the_plan = parse_train_args(script_args(script, *TWIN_COMMON, *TWINS[script])).plan
    roles = Counter(a["role"] for a in report["actors"])
    want = {
        r: len(p.bundles) for r, p in the_plan.roles.items() if r not in ("genrm", "advantages")
    }
    want["rollout"] = len(the_plan.engines_of("rollout"))
    want |= {f"genrm:{k}": len(the_plan.engines_of("genrm", k)) for k in the_plan.judges}
    assert dict(roles) == want
    used = {(a["node_id"], g) for a in report["actors"] for g in a["gpu_ids"]}
    assert len(used) == the_plan.num_gpus  # every GPU of the plan, by the plan's roles
