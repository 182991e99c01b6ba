"""Workspace-wide pytest rule: tests marked ``gpu`` run where CUDA is present, and are skipped,
with the reason shown, everywhere else (``pytest -rs`` lists it).

Why here and not in each package: the marker is declared once, in the root ``pyproject.toml``,
and this file is the root conftest that pytest loads for every test path, so one rule covers all
packages. torch is imported only when some collected test carries the marker: genrm-client's tests
(and its wheel-isolation test) must not pay for, or depend on, torch.
"""

from __future__ import annotations

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
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason=NO_GPU_REASON)
    for item in gpu_items:
        item.add_marker(skip)
