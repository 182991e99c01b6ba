"""The built genrm-rewards wheel installs beside genrm-client alone, and its rewards work there.

A trainer installs genrm-rewards for its reward functions next to its own torch, ray and
transformers; the wheel must bring none of them (nor genrm-serve, nor the judge's training
code, which lives in the unpublished packages/judge-train). So: build the genrm-rewards and
genrm-client wheels, install them into a fresh venv with nothing else, and check that what
got installed is exactly the closure of their ``Requires-Dist`` (read from the installed
metadata, so the test does not go stale with versions), that the heavy stacks are absent, and
that the ``math`` reward and dapo-genrm (with a stand-in judge) score a sample there.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO_ROOT = Path(__file__).resolve().parents[3]
DIRECT = {"genrm-client", "math-verify"}
NEVER = {"torch", "ray", "transformers", "genrm-serve", "genrm-judge-train"}

# Runs inside the fresh venv, from outside the repository: the imports must come from the wheels.
PROBE = r"""
import asyncio, json, sys, sysconfig
from types import SimpleNamespace

import genrm_rewards
from genrm_rewards import dapo_genrm, get_reward_fn


class StandInJudge:
    async def generate(self, messages, sampling_params=None, route_key=None, *, prefix_key=None):
        return "1"

    async def generate_batch(self, requests):
        raise AssertionError("one sample is one generate call")


sample = SimpleNamespace(
    prompt="What is 6 times 7?", response="6 * 7 = 42.\nAnswer: 42", label="42", metadata={}
)


async def score():
    math = await get_reward_fn("math")(SimpleNamespace(), sample)
    judged = await dapo_genrm.compute_score(SimpleNamespace(), sample, client=StandInJudge())
    return math, judged


math, judged = asyncio.run(score())
heavy = {"torch", "ray", "transformers", "genrm_serve", "genrm_judge_train"}
print(json.dumps({
    "version": genrm_rewards.__version__,
    "purelib": sysconfig.get_paths()["purelib"],
    "math": [math["score"], math["status"]],
    "dapo_genrm": [judged["score"], judged["status"]],
    "heavy_imported": sorted(m for m in sys.modules if m.split(".")[0] in heavy),
}))
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_wheel_installs_with_only_genrm_client_and_math_verify(
    tmp_path: Path, wheel_kit: Any
) -> None:
    dist_dir, index = wheel_kit.build(tmp_path / "dist", "genrm-rewards", "genrm-client")
    (rewards,) = dist_dir.glob("genrm_rewards-*.whl")
    (client,) = dist_dir.glob("genrm_client-*.whl")
    names = zipfile.ZipFile(rewards).namelist()
    assert {
        "genrm_rewards/py.typed",
        "genrm_rewards/dapo_genrm.py",
        "genrm_rewards/rules.py",
    } <= set(names)
    assert all(n.startswith(("genrm_rewards/", "genrm_rewards-")) for n in names), names
    assert not [n for n in names if "judge_examples" in n or "judge_train" in n]

    venv = tmp_path / "venv"
    env = wheel_kit.install(venv, [rewards, client], index)
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,  # not the repo: the imports must come from the installed wheels
        check=True,
    )
    report = json.loads(probe.stdout)
    assert report["version"] == "0.1.0"
    assert report["math"] == [1.0, "ok"] and report["dapo_genrm"] == [1.0, "ok"]
    assert report["heavy_imported"] == []

    installed = wheel_kit.installed(report["purelib"])
    requires = installed["genrm-rewards"].requires or []
    direct = {canonicalize_name(Requirement(r).name) for r in requires}
    assert direct == DIRECT
    closure, missing = wheel_kit.closure(installed, "genrm-rewards")
    assert missing == []
    assert set(installed) - wheel_kit.VENV_SEED == closure, (
        "installed beyond genrm-rewards' closure"
    )
    assert not NEVER & set(installed), NEVER & set(installed)
