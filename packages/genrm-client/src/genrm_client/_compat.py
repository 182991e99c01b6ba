"""Work-arounds for known bugs in our dependencies, each removable once the fix is released.

httpcore 1.0.x asks ``import sniffio`` every time it sets up a lock, event or semaphore, and
falls back to asyncio on ``ImportError``. anyio >= 4.11 no longer installs sniffio, and Python
does not cache a failed import, so every request pays several full ``sys.path`` scans: measured
here, the async client ran 1.4-1.8x slower (benchmarks/client_overhead.py). Upstream:
encode/httpcore#1103 (discussion #1102). When sniffio is not installed at all, recording that in
``sys.modules`` (``None`` is Python's documented "this module is absent" marker) makes the failed
import instant and changes no answer: httpcore still picks asyncio, ``find_spec`` still says
absent. When sniffio is installed, nothing is touched.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["mark_absent_sniffio"]


def mark_absent_sniffio() -> bool:
    """Record an absent ``sniffio`` in ``sys.modules``; return whether it was absent."""
    if "sniffio" in sys.modules:
        return sys.modules["sniffio"] is None
    if importlib.util.find_spec("sniffio") is not None:
        return False
    sys.modules["sniffio"] = None  # type: ignore[assignment]
    return True
