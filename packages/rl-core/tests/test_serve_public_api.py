"""rl-core uses genrm-serve only through its top level: ``genrm_serve``'s public surface.

The submodules behind it are genrm-serve's internals (they move when genrm-serve is
restructured), so an import of ``genrm_serve.<submodule>`` anywhere in rl-core's source, lazy
imports inside functions included, breaks the first time genrm-serve moves a file. Tests may
reach deeper (to fake an internal); this scan covers ``src/`` only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import genrm_serve

SRC = Path(__file__).resolve().parents[1] / "src" / "rl_core"


def _serve_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import of genrm_serve or below in one source file."""
    found: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "genrm_serve":
                    found.append((node.lineno, alias.name, []))
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "genrm_serve"
        ):
            found.append((node.lineno, str(node.module), [a.name for a in node.names]))
    return found


def test_rl_core_imports_no_genrm_serve_submodule() -> None:
    files = sorted(SRC.rglob("*.py"))
    assert files, f"no sources under {SRC}"
    deep = [
        f"{path.relative_to(SRC.parent)}:{line}: {module}"
        for path in files
        for line, module, _names in _serve_imports(path)
        if module != "genrm_serve"
    ]
    assert not deep, "rl-core imports genrm-serve past its public surface:\n" + "\n".join(deep)


def test_what_rl_core_imports_is_public_and_resolves() -> None:
    used = {
        name
        for path in sorted(SRC.rglob("*.py"))
        for _line, module, names in _serve_imports(path)
        if module == "genrm_serve"
        for name in names
    }
    assert used
    unlisted = sorted(used - set(genrm_serve.__all__))
    assert not unlisted, f"not in genrm_serve.__all__: {unlisted}"
    for name in sorted(used):
        assert getattr(genrm_serve, name) is not None, name
