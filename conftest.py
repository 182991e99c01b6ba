"""Workspace-wide pytest rule: tests marked ``gpu`` run where CUDA is present, and are skipped,
with the reason shown, everywhere else (``pytest -rs`` lists it).

Why here and not in each package: the marker is declared once, in the root ``pyproject.toml``,
and this file is the root conftest that pytest loads for every test path, so one rule covers all
packages. torch is imported only when some collected test carries the marker: genrm-client's tests
(and its wheel-isolation test) must not pay for, or depend on, torch.

It also holds the one fixture that tests of several packages share, ``wheel_kit``, and the
test process's one Ray, ``shared_ray``, for rl-core's end-to-end runs and the files that start
Serve or engine actors: on the 2-core machine a local Ray's start costs a file about 10 s (and
9 s of CPU), the files that use it run one after another in a test process, and a run finds the
Ray up and leaves it up, as under ``ray job submit``. Every other test file finds no Ray
started before it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: The skip reason of every ``gpu`` test on a machine without CUDA.
NO_GPU_REASON = "needs a CUDA GPU (torch.cuda.is_available() is False)"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # no torch at all: certainly no GPU to test on
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _slow_files_first(items)
    _skip_gpu_tests_without_cuda(items)


#: whether the Ray this process has up is ``shared_ray``'s (and not a leftover of another file's)
_SHARED_RAY = {"up": False}
#: the test files with a test on ``shared_ray`` (found at collection)
_SHARED_RAY_FILES: set[Path] = set()


def _slow_files_first(items: list[pytest.Item]) -> None:
    """Collected in this order: the files on ``shared_ray`` first of all, then the other files
    holding a ``slow`` test; each file's tests in their own order.

    In one test process (``GENRM_TEST_WORKERS=0``) this is the order files run in: the files
    on the shared Ray, collected together, follow one another on one Ray. scripts/test.sh's
    pytest-xdist (``--dist loadfile``) re-sorts whole files by their number of tests, most
    first, and this order decides only between files of equal count. Handing files out in this
    order instead (``--no-loadscope-reorder``) was measured from a clean clone: pytest 1,215 s
    against 1,183 s, the tail no shorter (59 s between the processes' ends against 47 s)."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    shared = _SHARED_RAY_FILES
    shared |= {item.path for item in items if "shared_ray" in item.fixturenames}
    # stable: the order within each file
    items.sort(key=lambda item: (item.path not in shared, item.path not in slow))


def _skip_gpu_tests_without_cuda(items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason=NO_GPU_REASON)
    for item in gpu_items:
        item.add_marker(skip)


class WheelKit:
    """Building the workspace's wheels and installing them alone in a fresh venv.

    The wheel-isolation tests of the published packages share it: each builds its wheels, puts
    them in a venv with nothing else, and compares what got installed with the closure of the
    installed metadata's ``Requires-Dist`` (so the tests do not go stale with versions).
    """

    #: installed into a fresh venv by ensurepip; not brought by any wheel
    VENV_SEED = frozenset({"pip", "setuptools"})

    def __init__(self, root: Path) -> None:
        self.root = root

    @staticmethod
    def uv() -> list[str]:
        """The uv that runs this test session (``uv run`` exports ``UV``), else one on PATH."""
        if os.environ.get("UV"):
            return [os.environ["UV"]]
        return ["uv"] if shutil.which("uv") else [sys.executable, "-m", "uv"]

    def build(self, out: Path, *packages: str) -> tuple[Path, list[str]]:
        """The folder holding the wheels of ``packages``, and the install flags it needs.

        Offline (``GENRM_WHEELHOUSE``, set by scripts/test-offline.sh) the wheelhouse already
        holds them and their dependencies; else they are built here and their dependencies
        come from uv's cache or the package registry.
        """
        wheelhouse = os.environ.get("GENRM_WHEELHOUSE")
        if wheelhouse:
            return Path(wheelhouse), ["--no-index", "--find-links", wheelhouse]
        for package in packages:
            subprocess.run(
                [*self.uv(), "build", "--package", package, "--wheel", "-o", str(out)],
                cwd=self.root,
                check=True,
                capture_output=True,
                timeout=300,
            )
        return out, []

    def install(self, venv: Path, wheels: list[Path], index: list[str]) -> dict[str, str]:
        """A fresh venv holding ``wheels`` and their dependencies alone; the environment to run
        its python with. Offline, the venv's own pip; else uv, into a venv without pip."""
        env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
        python = venv / "bin" / "python"
        if index:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
            command = [str(python), "-m", "pip", "install", "--quiet"]
            command.append("--disable-pip-version-check")
        else:
            subprocess.run(
                [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
            )
            command = [*self.uv(), "pip", "install", "--quiet", "--python", str(python)]
        done = subprocess.run(
            [*command, *index, *map(str, wheels)],
            capture_output=True,
            text=True,
            timeout=400,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return env

    @staticmethod
    def installed(purelib: str) -> dict[str, Any]:
        """The distributions installed in a venv's site-packages, by canonical name."""
        import importlib.metadata as md

        from packaging.utils import canonicalize_name

        return {canonicalize_name(d.metadata["Name"]): d for d in md.distributions(path=[purelib])}

    @staticmethod
    def closure(installed: dict[str, Any], root: str) -> tuple[set[str], list[str]]:
        """The distributions ``root`` requires, transitively (markers evaluated, extras
        followed), and those of them that are missing."""
        from packaging.requirements import Requirement
        from packaging.utils import canonicalize_name

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


@pytest.fixture(scope="session")
def wheel_kit() -> WheelKit:
    """Build and install the workspace's wheels alone (the wheel-isolation tests)."""
    return WheelKit(Path(__file__).resolve().parent)


@pytest.fixture(scope="module")
def shared_ray() -> Iterator[None]:
    """This test process's local Ray for the runs of the files that ask for it, on CPU only
    (``CUDA_VISIBLE_DEVICES`` empty when it starts: Ray counts no GPU, every role computes on
    CPU); kept up for the next such file, shut down before any other file and at the end.

    What a run's processes inherit is the environment of Ray's start, not of the test: a file
    that sets a variable the run's actors read must not ask for it. A file gives back every CPU
    it took (its placement groups removed, its actors gone) before the next one starts, or its
    last test errors naming what is still held."""
    import ray

    if not (_SHARED_RAY["up"] and ray.is_initialized()):
        ray.shutdown()
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("CUDA_VISIBLE_DEVICES", "")
            ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
        _SHARED_RAY["up"] = True
    yield
    if _SHARED_RAY["up"] and ray.is_initialized():  # not where the file shut it down itself
        _everything_given_back(ray)


def _everything_given_back(ray: Any, timeout_s: float = 30.0) -> None:
    """Wait until the shared Ray has every CPU free again (Ray frees what it kills a moment
    later); fail the file if it does not."""
    total = ray.cluster_resources().get("CPU", 0.0)
    deadline = time.monotonic() + timeout_s
    while (free := ray.available_resources().get("CPU", 0.0)) < total:
        if time.monotonic() > deadline:
            pytest.fail(
                f"the shared Ray: {total - free:g} of {total:g} CPUs still held {timeout_s:g} s "
                "after the file's last test (an actor or placement group it did not end)",
                pytrace=False,
            )
        time.sleep(0.2)


@pytest.fixture(scope="module", autouse=True)
def _no_ray_left_up(request: pytest.FixtureRequest) -> None:
    """A file that does not ask for ``shared_ray`` starts with no Ray up in this process."""
    if "ray" not in sys.modules or request.path in _SHARED_RAY_FILES:
        return
    import ray

    if ray.is_initialized():
        ray.shutdown()
    _SHARED_RAY["up"] = False


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _SHARED_RAY["up"] and "ray" in sys.modules:
        import ray

        ray.shutdown()
