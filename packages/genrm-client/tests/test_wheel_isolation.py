"""The built genrm-client wheel installs alone, pulling in only httpx, pydantic, pydantic-settings.

A reward author runs ``pip install genrm-client`` beside their own training stack; anything more
(ray, torch, fastapi) would be a conflict waiting to happen. The allowed set is computed from the
installed packages' own ``Requires-Dist`` metadata, so the test does not go stale with versions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
DIRECT = {"httpx", "pydantic", "pydantic-settings"}
# Installed into every fresh venv by ensurepip; not brought by the wheel.
VENV_SEED = {"pip", "setuptools"}

# Runs inside the fresh venv: installed distributions, and the closure of genrm-client's
# Requires-Dist (markers evaluated, extras followed) over them.
CLOSURE_SCRIPT = r"""
import importlib.metadata as md, json
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

installed = {canonicalize_name(d.metadata["Name"]): d for d in md.distributions()}
direct = [Requirement(r) for r in installed["genrm-client"].requires or []]
seen, missing, todo = set(), [], [("genrm-client", frozenset())]
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
import genrm_client
print(json.dumps({
    "installed": sorted(installed),
    "closure": sorted({name for name, _ in seen}),
    "missing": missing,
    "direct": sorted(canonicalize_name(r.name) for r in direct if r.marker is None),
    "version": genrm_client.__version__,
}))
"""


def _uv() -> list[str]:
    """The uv that runs this test session (``uv run`` exports ``UV``), else one on PATH."""
    if os.environ.get("UV"):
        return [os.environ["UV"]]
    if shutil.which("uv"):
        return ["uv"]
    return ["python3", "-m", "uv"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_wheel_installs_alone_with_only_its_three_dependencies(tmp_path: Path) -> None:
    # Offline (scripts/test-offline.sh): the wheelhouse holds the built wheel and its
    # dependencies; otherwise build it here and install from the package registry.
    wheelhouse = os.environ.get("GENRM_WHEELHOUSE")
    if wheelhouse:
        dist_dir = Path(wheelhouse)
        index = ["--no-index", "--find-links", wheelhouse]
    else:
        dist_dir, index = tmp_path / "dist", []
        subprocess.run(
            [*_uv(), "build", "--package", "genrm-client", "--wheel", "-o", str(dist_dir)],
            cwd=REPO_ROOT,
            check=True,
            capture_output=True,
            timeout=300,
        )
    (wheel,) = dist_dir.glob("genrm_client-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"genrm_client/py.typed", "genrm_client/types.py", "genrm_client/_client.py"} <= set(
        names
    )
    assert all(n.startswith(("genrm_client/", "genrm_client-")) for n in names), names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    pip = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *index,
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]

    probe = subprocess.run(
        [str(python), "-c", CLOSURE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,  # not the repo: the import must come from the installed wheel
        check=True,
    )
    report = json.loads(probe.stdout)
    assert report["version"] == "0.1.0"
    assert set(report["direct"]) == DIRECT
    assert report["missing"] == []
    extra = set(report["installed"]) - VENV_SEED - set(report["closure"])
    assert extra == set(), f"installed beyond genrm-client's dependency closure: {extra}"
    assert DIRECT | {"genrm-client"} <= set(report["installed"])
