"""The built genrm-client wheel installs alone, pulling in only httpx, pydantic, pydantic-settings.

A reward author runs ``pip install genrm-client`` beside their own training stack; anything more
(ray, torch, fastapi) would be a conflict waiting to happen. The allowed set is the closure of the
installed packages' own ``Requires-Dist`` metadata (the root conftest's ``wheel_kit``), so the
test does not go stale with versions.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

DIRECT = {"httpx", "pydantic", "pydantic-settings"}

# Runs inside the fresh venv, from outside the repository: the import must come from the wheel.
PROBE = r"""
import json, sysconfig
import genrm_client
print(json.dumps({"version": genrm_client.__version__,
                  "purelib": sysconfig.get_paths()["purelib"]}))
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_wheel_installs_alone_with_only_its_three_dependencies(
    tmp_path: Path, wheel_kit: Any
) -> None:
    dist_dir, index = wheel_kit.build(tmp_path / "dist", "genrm-client")
    (wheel,) = dist_dir.glob("genrm_client-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"genrm_client/py.typed", "genrm_client/types.py", "genrm_client/_client.py"} <= set(
        names
    )
    assert all(n.startswith(("genrm_client/", "genrm_client-")) for n in names), names

    venv = tmp_path / "venv"
    env = wheel_kit.install(venv, [wheel], index)
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,  # not the repo: the import must come from the installed wheel
        check=True,
    )
    report = json.loads(probe.stdout)
    assert report["version"] == "0.1.0"
    installed = wheel_kit.installed(report["purelib"])
    from packaging.requirements import Requirement

    requires = [Requirement(r) for r in installed["genrm-client"].requires or []]
    assert {r.name for r in requires if r.marker is None} == DIRECT
    closure, missing = wheel_kit.closure(installed, "genrm-client")
    assert missing == []
    extra = set(installed) - wheel_kit.VENV_SEED - closure
    assert extra == set(), f"installed beyond genrm-client's dependency closure: {extra}"
