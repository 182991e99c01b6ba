"""Release one package of the workspace from its own tag: ``<distribution>-v<version>``.

Each published wheel has its own version (its ``pyproject.toml``), its own ``CHANGELOG.md`` and
its own tags (``genrm-client-v0.1.0``, ``genrm-rl-core-v0.2.0``, ...), so a fix to the client
ships without a new trainer. ``.github/workflows/release.yml`` runs the three steps below; each
also runs on a checkout (standard library only, Python >= 3.11):

    python3 scripts/release.py check genrm-client-v0.1.0     # the tag names a package, its
                                                             # version and a changelog entry
    python3 -m uv build --package genrm-client --no-sources --out-dir dist
    python3 scripts/release.py metadata dist                 # the built files' metadata
    python3 scripts/release.py smoke genrm-client dist --find-links siblings

``check`` prints ``package=…``, ``version=…`` and ``directory=…`` lines (the workflow appends
them to ``$GITHUB_OUTPUT``). ``smoke`` installs the wheel alone in a fresh venv with its own
dependencies (``--find-links`` for sibling wheels not yet on the index) and imports it there, from
outside the checkout, and checks ``__version__``.
"""

from __future__ import annotations

import argparse
import email.parser
import re
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

#: distribution → (folder under packages/, import name, console script or None)
PUBLISHED: dict[str, tuple[str, str, str | None]] = {
    "genrm-client": ("genrm-client", "genrm_client", None),
    "genrm-serve": ("genrm-serve", "genrm_serve", "genrm-serve"),
    "genrm-rewards": ("rewards", "genrm_rewards", None),
    "genrm-rl-core": ("rl-core", "rl_core", "rl-core"),
}

_TAG = re.compile(r"^(?P<package>[a-z][a-z0-9-]*?)-v(?P<version>\d+\.\d+\.\d+(?:[.-]?\w+)*)$")


class ReleaseError(Exception):
    """A release that must not go out; the message names what and how to fix it."""


@dataclass(frozen=True)
class Release:
    package: str
    version: str
    directory: Path


def check_tag(tag: str, root: Path = REPO_ROOT) -> Release:
    """The release a tag asks for, refused unless the package is published, its pyproject has
    that version and its CHANGELOG.md has an entry (``## <version>``) for it."""
    tag = tag.removeprefix("refs/tags/")
    match = _TAG.match(tag)
    if match is None:
        raise ReleaseError(f"tag {tag!r}: expected <package>-v<version>, e.g. genrm-client-v0.1.0")
    package, version = match["package"], match["version"]
    if package not in PUBLISHED:
        raise ReleaseError(
            f"tag {tag!r}: {package!r} is not a published package (one of {sorted(PUBLISHED)})"
        )
    directory = root / "packages" / PUBLISHED[package][0]
    project = tomllib.loads((directory / "pyproject.toml").read_text())["project"]
    if project["name"] != package:
        raise ReleaseError(f"{directory}/pyproject.toml names {project['name']!r}, not {package!r}")
    if project["version"] != version:
        raise ReleaseError(
            f"tag {tag!r}: {directory.relative_to(root)}/pyproject.toml has version "
            f"{project['version']!r}; set it to {version!r} (and commit) before tagging"
        )
    changelog = directory / "CHANGELOG.md"
    if not changelog.is_file():
        raise ReleaseError(f"{changelog.relative_to(root)}: missing")
    heading = re.compile(rf"^## \[?{re.escape(version)}\]?(\s|$)", re.MULTILINE)
    entry = heading.search(changelog.read_text())
    if entry is None:
        raise ReleaseError(
            f"{changelog.relative_to(root)}: no '## {version}' entry; say what the release changes"
        )
    line = changelog.read_text()[entry.start() :].split("\n", 1)[0]
    if "unreleased" in line.lower():
        raise ReleaseError(
            f"{changelog.relative_to(root)}: {line!r} is marked unreleased; put the release "
            f"date in its place (## {version} (YYYY-MM-DD)) and commit before tagging"
        )
    return Release(package, version, directory)


def check_metadata(dist: Path) -> list[str]:
    """What each wheel's METADATA lacks for an index page: name, version, summary, a README
    of a declared content type, a license and a Python floor (what ``twine check`` looks at,
    without the network). Returns the problems, one line each; none means fine."""
    problems = []
    wheels = sorted(dist.glob("*.whl"))
    if not wheels:
        return [f"{dist}: no wheel"]
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
            meta = email.parser.Parser().parsestr(zf.read(name).decode())
        for field in ("Name", "Version", "Summary", "Requires-Python"):
            if not meta.get(field):
                problems.append(f"{wheel.name}: no {field}")
        if not (meta.get("License-Expression") or meta.get("License")):
            problems.append(f"{wheel.name}: no license")
        if meta.get("Description-Content-Type") != "text/markdown":
            problems.append(f"{wheel.name}: the README is not declared text/markdown")
        if len(meta.get_payload() or "") < 200:
            problems.append(f"{wheel.name}: the long description (README) is missing or short")
    return problems


def smoke(package: str, dist: Path, find_links: list[Path]) -> str:
    """Install ``package``'s wheel from ``dist`` alone in a fresh venv (its dependencies from the
    index, siblings from ``find_links``), import it from outside the checkout and return its
    ``__version__``; run its console script's ``--help`` where it has one."""
    _, module, script = PUBLISHED[package]
    (wheel,) = dist.glob(package.replace("-", "_") + "-*.whl")
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        links = [a for d in find_links for a in ("--find-links", str(d))]
        python = str(venv / "bin" / "python")
        subprocess.run([python, "-m", "pip", "install", "--quiet", *links, str(wheel)], check=True)
        probe = f"import {module}; print({module}.__version__)"
        out = subprocess.run(
            [python, "-c", probe], check=True, capture_output=True, text=True, cwd=tmp
        )
        if script is not None:
            subprocess.run([str(venv / "bin" / script), "--help"], check=True, cwd=tmp)
        return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="release.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("check", help="the tag names a package, its version and a changelog entry")
    p.add_argument("tag")
    p = sub.add_parser("metadata", help="the built wheels' metadata is complete")
    p.add_argument("dist", type=Path)
    p = sub.add_parser("smoke", help="the wheel installs alone in a fresh venv and imports")
    p.add_argument("package", choices=sorted(PUBLISHED))
    p.add_argument("dist", type=Path)
    p.add_argument("--find-links", type=Path, action="append", default=[])
    p.add_argument("--expect-version", default=None, help="fail unless __version__ is this")
    args = parser.parse_args(argv)
    try:
        if args.step == "check":
            release = check_tag(args.tag)
            print(f"package={release.package}")
            print(f"version={release.version}")
            print(f"directory={release.directory.relative_to(REPO_ROOT)}")
        elif args.step == "metadata":
            problems = check_metadata(args.dist)
            for line in problems:
                print(f"release.py metadata: {line}", file=sys.stderr)
            return 1 if problems else 0
        else:
            version = smoke(args.package, args.dist, args.find_links)
            if args.expect_version not in (None, version):
                raise ReleaseError(
                    f"{args.package}: the installed wheel's __version__ is {version!r}, "
                    f"not {args.expect_version!r}"
                )
            print(f"{args.package} {version} installs alone and imports")
    except ReleaseError as err:
        print(f"release.py: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
