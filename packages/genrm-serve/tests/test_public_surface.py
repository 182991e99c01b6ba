"""genrm_serve's top level: every public name resolves through one table, an old name through
its alias, and ``import genrm_serve`` loads neither Ray nor torch (rl-core's config and CLI
import it in processes that need neither)."""

from __future__ import annotations

import subprocess
import sys

import genrm_serve


def test_every_public_name_has_an_owner() -> None:
    public = set(genrm_serve.__all__) - {"__version__"}
    owned = set(genrm_serve._EXPORTS) | set(genrm_serve._ALIASES)
    assert public == owned
    assert set(genrm_serve._ALIASES.values()) <= set(genrm_serve._EXPORTS)


def test_import_loads_neither_ray_nor_torch() -> None:
    code = (
        "import sys, genrm_serve; "
        "print(sorted(m for m in ('ray', 'torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "[]"
