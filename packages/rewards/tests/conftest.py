"""Fixtures of the genrm-rewards tests; helpers live in ``rewards_doubles`` (same folder)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from genrm_rewards import dapo_genrm

# --import-mode=importlib does not put test folders on sys.path; the helpers module needs it.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _fresh_verdict_cache() -> None:
    dapo_genrm.clear_verdict_cache()
