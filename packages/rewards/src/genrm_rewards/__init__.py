"""Reward functions that call GenRM judges (dapo-genrm, dual, agentic)."""

from importlib.metadata import version as _version

__version__ = _version("genrm-rewards")
