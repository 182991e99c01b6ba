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

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO_ROOT = Path(__file__).resolve().parents[3]
DIRECT = {"genrm-client", "math-verify"}
NEVER = {"torch", "ray", "transformers", "genrm-serve", "genrm-judge-train"}
# Installed into a fresh venv by ensurepip (offline runs); not brought by the wheels.
VENV_SEED = {"pip", "setuptools"}

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


def _uv() -> list[str]:
    """The uv that runs this test session (``uv run`` exports ``UV``), else one on PATH."""
    if os.environ.get("UV"):
        return [os.environ["UV"]]
    if shutil.which("uv"):
        return ["uv"]
    return ["python3", "-m", "uv"]


def _wheels(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """The two wheels, and how to install: from the wheelhouse offline (scripts/test-offline.sh
    sets ``GENRM_WHEELHOUSE``), else built here and installed with uv from its cache or the
    package registry."""
    wheelhouse = os.environ.get("GENRM_WHEELHOUSE")
    if wheelhouse:
        dist_dir = Path(wheelhouse)
    else:
        dist_dir = tmp_path / "dist"
        for package in ("genrm-rewards", "genrm-client"):
            subprocess.run(
                [*_uv(), "build", "--package", package, "--wheel", "-o", str(dist_dir)],
                cwd=REPO_ROOT,
                check=True,
                capture_output=True,
                timeout=300,
            )
    (rewards,) = dist_dir.glob("genrm_rewards-*.whl")
    (client,) = dist_dir.glob("genrm_client-*.whl")
    index = ["--no-index", "--find-links", str(dist_dir)] if wheelhouse else []
    return rewards, client, index


def _install(venv: Path, wheels: list[Path], index: list[str], env: dict[str, str]) -> None:
    """Offline, the venv's own pip (as genrm-client's test); else uv, into a venv without pip."""
    python = venv / "bin" / "python"
    if index:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        command = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    else:
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
        )
        command = [*_uv(), "pip", "install", "--quiet", "--python", str(python)]
    done = subprocess.run(
        [*command, *index, *map(str, wheels)], capture_output=True, text=True, timeout=400, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _closure(installed: dict[str, md.Distribution], root: str) -> tuple[set[str], list[str]]:
    """The distributions ``root`` requires, transitively (markers evaluated, extras followed),
    and those of them that are missing."""
    seen: set[tuple[str, frozenset[str]]] = set()
    missing: list[str] = []
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        dist = installed.get(name)
        if dist is None:
            missing.append(name)
            continue
        for raw in dist.requires or []:
            req = Requirement(raw)
            envs = [{"extra": e} for e in sorted(extras | {""})]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return {name for name, _ in seen}, missing


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_wheel_installs_with_only_genrm_client_and_math_verify(tmp_path: Path) -> None:
    rewards, client, index = _wheels(tmp_path)
    names = zipfile.ZipFile(rewards).namelist()
    assert {
        "genrm_rewards/py.typed",
        "genrm_rewards/dapo_genrm.py",
        "genrm_rewards/rules.py",
    } <= set(names)
    assert all(n.startswith(("genrm_rewards/", "genrm_rewards-")) for n in names), names
    assert not [n for n in names if "judge_examples" in n or "judge_train" in n]

    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    _install(venv, [rewards, client], index, env)
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

    dists = md.distributions(path=[report["purelib"]])
    installed = {canonicalize_name(d.metadata["Name"]): d for d in dists}
    requires = installed["genrm-rewards"].requires or []
    direct = {canonicalize_name(Requirement(r).name) for r in requires}
    assert direct == DIRECT
    closure, missing = _closure(installed, "genrm-rewards")
    assert missing == []
    assert set(installed) - VENV_SEED == closure, "installed beyond genrm-rewards' closure"
    assert not NEVER & set(installed), NEVER & set(installed)
