"""The sniffio work-around answers exactly as before, only without re-scanning sys.path."""

from __future__ import annotations

import subprocess
import sys

PROBE = r"""
import asyncio, importlib.util, sys
installed = importlib.util.find_spec("sniffio") is not None
import genrm_client  # applies the work-around
from httpcore._synchronization import current_async_library

assert (importlib.util.find_spec("sniffio") is not None) == installed
try:
    import sniffio
    importable = True
except ImportError:
    importable = False
assert importable == installed, (importable, installed)
assert (sys.modules.get("sniffio", "?") is None) == (not installed)

async def main() -> str:
    return current_async_library()

assert asyncio.run(main()) == "asyncio"
print("installed" if installed else "absent")
"""


def test_absent_sniffio_is_recorded_and_answers_are_unchanged() -> None:
    # A fresh interpreter: the test session may already have imported things.
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() in {"installed", "absent"}
