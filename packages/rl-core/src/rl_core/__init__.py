"""Placement and GRPO trainer core for RL with GenRM judges."""

from importlib.metadata import version as _version

__version__ = _version("genrm-rl-core")
