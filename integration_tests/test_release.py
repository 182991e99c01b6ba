"""The release path (RELEASING.md): a tag releases one package, checked against its pyproject and
its changelog; the workflow releases exactly the published packages, by trusted publishing; the
built wheel's metadata is complete.

No network: the tag checks run on a copy of a package's two files, the metadata check on a wheel
built here. Installing each wheel alone in a fresh venv is the wheel-isolation tests' job
(``packages/genrm-client/tests``, ``packages/rewards/tests``) and the workflow's ``smoke`` step.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def _release_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release", ROOT / "scripts" / "release.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["release"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


release = _release_module()


def _fake_repo(tmp_path: Path, version: str, changelog: str | None) -> Path:
    package = tmp_path / "packages" / "genrm-client"
    package.mkdir(parents=True)
    text = (ROOT / "packages/genrm-client/pyproject.toml").read_text()
    project = tomllib.loads(text)["project"]
    package.joinpath("pyproject.toml").write_text(
        text.replace(f'version = "{project["version"]}"', f'version = "{version}"', 1)
    )
    if changelog is not None:
        package.joinpath("CHANGELOG.md").write_text(changelog)
    return tmp_path


def test_every_published_package_has_its_version_and_a_changelog_entry_for_it() -> None:
    for name, (folder, module, _) in release.PUBLISHED.items():
        directory = ROOT / "packages" / folder
        project = tomllib.loads((directory / "pyproject.toml").read_text())["project"]
        assert project["name"] == name
        assert (directory / "src" / module / "__init__.py").read_text().count("__version__")
        # the tag of the current version is refused only for being unreleased, if at all
        try:
            release.check_tag(f"{name}-v{project['version']}")
        except release.ReleaseError as err:
            assert "marked unreleased" in str(err), err


def test_a_dated_entry_and_the_pyprojects_version_make_a_release(tmp_path: Path) -> None:
    root = _fake_repo(tmp_path, "0.2.0", "# Changelog\n\n## 0.2.0 (2027-01-15)\n\nFixes.\n")
    got = release.check_tag("refs/tags/genrm-client-v0.2.0", root)
    assert (got.package, got.version) == ("genrm-client", "0.2.0")
    assert got.directory == root / "packages" / "genrm-client"


@pytest.mark.parametrize(
    ("tag", "changelog", "message"),
    [
        ("genrm-client-v0.3.0", "## 0.2.0 (2027-01-15)\n", "has version '0.2.0'; set it to"),
        ("genrm-client-v0.2.0", "## 0.1.0 (2026-12-01)\n", "no '## 0.2.0' entry"),
        ("genrm-client-v0.2.0", "## 0.2.0 (unreleased)\n", "marked unreleased"),
        ("genrm-client-v0.2.0", None, "CHANGELOG.md: missing"),
        ("genrm-judge-train-v0.1.0", "", "not a published package"),
        ("v0.2.0", "", "expected <package>-v<version>"),
    ],
    ids=["version-not-bumped", "no-entry", "unreleased", "no-changelog", "private", "bare-tag"],
)
def test_a_tag_that_must_not_release_is_refused_with_the_fix(
    tmp_path: Path, tag: str, changelog: str | None, message: str
) -> None:
    root = _fake_repo(tmp_path, "0.2.0", changelog)
    with pytest.raises(release.ReleaseError, match=message.replace("(", r"\(")):
        release.check_tag(tag, root)


def test_the_workflow_releases_the_published_packages_by_trusted_publishing() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as true
    assert sorted(triggers["push"]["tags"]) == sorted(f"{n}-v*" for n in release.PUBLISHED)
    steps = " ".join(str(s.get("run", "")) for s in workflow["jobs"]["build"]["steps"])
    for step in ("release.py check", "release.py metadata", "twine check", "release.py smoke"):
        assert step in steps
    assert "--no-sources" in steps
    publish = workflow["jobs"]["publish"]
    assert publish["permissions"] == {"id-token": "write"}
    assert publish["environment"]["name"] == "pypi"
    uses = [s.get("uses", "") for s in publish["steps"]]
    assert any(u.startswith("pypa/gh-action-pypi-publish@") for u in uses)
    assert not any("password" in str(s.get("with", {})) for s in publish["steps"])


@pytest.mark.timeout(300)
def test_the_built_wheel_has_the_metadata_an_index_page_needs(
    tmp_path: Path, wheel_kit: Any
) -> None:
    subprocess.run(
        [
            *wheel_kit.uv(),
            "build",
            "--package",
            "genrm-client",
            "--wheel",
            "--no-sources",
            "-o",
            tmp_path,
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert release.check_metadata(tmp_path) == []
    assert release.check_metadata(tmp_path / "none") == [f"{tmp_path / 'none'}: no wheel"]
