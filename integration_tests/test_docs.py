"""Every shell command and Python snippet of the READMEs runs here, or says where it is tested.

Each fenced ``bash`` / ``sh`` / ``shell`` / ``console`` / ``python`` block of the READMEs (the
root, the packages', the examples') is one of:

- a ``console`` block: each ``$ `` command is run here, on CPU, and what follows it up to the next
  ``$ `` is its expected output (stdout and stderr together). In the expected output a line
  ``...`` stands for any number of lines, and a line ending in ``...`` for any line that starts
  with what comes before (as doctest's ELLIPSIS). The commands this test knows: ``rl-core plan``
  (run in process: a fraction of a second each) and ``echo $?`` (the exit status of the one
  before);
- a block whose nearest non-blank line above is a marker, one HTML comment (GitHub shows none):
  ``<!-- covered-by: path/to/test_file.py::test_name [more ...] -->`` (each named test must exist:
  that test runs what the block shows, against what the docs say to start);
  ``<!-- gpu-only -->`` (needs GPUs, a cluster or hours: checked by hand and the benchmark
  report); ``<!-- illustrative -->`` (a fragment: names defined by the reader, flags to paste
  into a command line); ``<!-- by-hand: benchmarks/REPORT.md#row -->`` (minutes of a whole
  job, run by hand: the benchmark report's row, which must exist, says when and how long).

A block with neither fails, as does a console block whose output drifted from the code's. So a
README snippet that drifts from the code fails CI, and a new snippet must say how it is tested.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READMES = sorted(
    {
        ROOT / "README.md",
        ROOT / "RELEASING.md",
        *ROOT.glob("packages/*/README.md"),
        *ROOT.glob("examples/**/README.md"),
    }
)
CHECKED = {"bash", "sh", "shell", "console", "python"}
MARKER = re.compile(r"^<!--\s*(covered-by:|by-hand:|gpu-only|illustrative)\s*(.*?)\s*-->$")
FENCE = re.compile(r"^(\s*)(```|~~~)\s*([\w+-]*)")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None  # "covered-by: ...", "by-hand: ...", "gpu-only", "illustrative"

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks of the checked languages, each with its marker (if any)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start, fence, lang = i, m[2], m[3].lower()
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            i += 1
        body = "\n".join(line.removeprefix(m[1]) for line in lines[start + 1 : i])
        i += 1
        if lang not in CHECKED:
            continue
        above = next((line.strip() for line in reversed(lines[:start]) if line.strip()), "")
        mark = MARKER.match(above)
        marker = f"{mark[1]} {mark[2]}".strip() if mark else None
        found.append(Block(page, start + 1, lang, body, marker))
    return found


ALL = [b for page in READMES for b in blocks(page)]


def _id(block: Block) -> str:
    return block.where


def test_the_readmes_have_blocks_to_check() -> None:
    assert len(READMES) >= 6
    assert sum(b.lang == "console" for b in ALL) >= 2


@pytest.mark.parametrize("block", ALL, ids=_id)
def test_every_block_runs_here_or_is_marked(block: Block) -> None:
    if block.lang == "console":
        assert block.marker is None, f"{block.where}: a console block is run; drop its marker"
        return  # run by test_console_block_output_is_the_codes
    assert block.marker is not None, (
        f"{block.where}: a {block.lang} block with no marker; run it in a test and say so with "
        "<!-- covered-by: path::test -->, or mark it <!-- gpu-only --> / <!-- illustrative -->"
    )
    if block.marker.startswith("by-hand:"):
        path, _, anchor = block.marker.removeprefix("by-hand:").strip().partition("#")
        report = ROOT / path
        assert report.is_file(), f"{block.where}: by-hand {path}: no such file"
        assert f'<a id="{anchor}">' in report.read_text(), (
            f"{block.where}: by-hand {path}#{anchor}: no such row"
        )
    if block.marker.startswith("covered-by:"):
        refs = block.marker.removeprefix("covered-by:").replace(",", " ").split()
        assert refs, f"{block.where}: covered-by names no test"
        for ref in refs:
            path, _, name = ref.partition("::")
            file = ROOT / path
            assert file.is_file(), f"{block.where}: covered-by {ref}: no file {path}"
            pattern = rf"^\s*(async\s+)?def {re.escape(name)}\("
            assert name and re.search(pattern, file.read_text(), re.MULTILINE), (
                f"{block.where}: covered-by {ref}: no test {name!r} in {path}"
            )


def _commands(text: str) -> list[tuple[str, list[str]]]:
    """A console block's (command, expected output lines); ``\\`` continues a command."""
    out: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        assert line.startswith("$ "), f"console output before any command: {line!r}"
        command = line[2:]
        while command.endswith("\\"):
            i += 1
            command = command[:-1] + " " + lines[i].strip()
        i += 1
        expected = []
        while i < len(lines) and not lines[i].startswith("$ "):
            expected.append(lines[i])
            i += 1
        out.append((command, expected))
    return out


def _matches(expected: list[str], got: list[str]) -> bool:
    """``got`` fits ``expected``, where a line ``...`` is any lines and ``X...`` any line X*."""
    if not expected:
        return not got
    head, rest = expected[0], expected[1:]
    if head.strip() == "...":
        return any(_matches(rest, got[k:]) for k in range(len(got) + 1))
    if not got:
        return False
    line = got[0].rstrip()
    ok = line.startswith(head[:-3]) if head.endswith("...") else line == head.rstrip()
    return ok and _matches(rest, got[1:])


def _run(command: str, last_status: int) -> tuple[int, str]:
    argv = shlex.split(command)
    if argv == ["echo", "$?"]:
        return 0, f"{last_status}\n"
    if argv[:2] == ["rl-core", "plan"]:
        from rl_core.cli import main

        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            status = main(argv[1:])
        return status, buffer.getvalue()
    raise AssertionError(f"a console block runs only rl-core plan and echo $?, not {command!r}")


@pytest.mark.parametrize("block", [b for b in ALL if b.lang == "console"], ids=_id)
def test_console_block_output_is_the_codes(block: Block) -> None:
    status = 0
    for command, expected in _commands(block.text):
        status, output = _run(command, status)
        got = output.rstrip("\n").splitlines()
        assert _matches(expected, got), (
            f"{block.where}: `{command}` printed\n"
            + "\n".join(got)
            + "\nwhere the README shows\n"
            + "\n".join(expected)
        )


@pytest.mark.parametrize(
    ("expected", "got", "fits"),
    [
        (["a", "b"], ["a", "b"], True),
        (["a", "..."], ["a", "b", "c"], True),
        (["a", "...", "c"], ["a", "c"], True),
        (["mode: x..."], ["mode: xyz"], True),
        (["a", "b"], ["a", "c"], False),
        (["a"], ["a", "b"], False),
    ],
    ids=["same", "tail-elided", "middle-elided-empty", "line-prefix", "differs", "extra-line"],
)
def test_the_output_matcher(expected: list[str], got: list[str], fits: bool) -> None:
    assert _matches(expected, got) is fits


def test_a_marker_counts_only_right_above_its_block(tmp_path: Path) -> None:
    page = tmp_path / "README.md"
    page.write_text(
        "<!-- gpu-only -->\n```bash\nnvidia-smi\n```\n\ntext\n\n```python\nprint(1)\n```\n"
        "\n<!-- covered-by: a.py::test_b -->\n\n```sh\nls\n```\n\n```text\nnot checked\n```\n"
    )
    found = [(b.line, b.lang, b.marker) for b in blocks(page)]
    assert found == [
        (2, "bash", "gpu-only"),
        (8, "python", None),  # fails test_every_block_runs_here_or_is_marked
        (14, "sh", "covered-by: a.py::test_b"),
    ]
