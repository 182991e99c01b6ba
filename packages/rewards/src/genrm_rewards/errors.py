"""Errors of genrm-rewards: bad configuration and bad samples fail loudly, at the earliest point.

::

    RewardError
     ├── RewardConfigError   an args value, a registry name or a --custom-rm-path is wrong
     └── RewardInputError    a sample lacks what the reward function needs (key, value, rule)

A *judge* failure is not an exception here: it becomes a result with status ``"judge_error"``
and score ``None`` so the trainer can keep the sample out of the loss (see ``types``).
"""

from __future__ import annotations

__all__ = ["RewardConfigError", "RewardError", "RewardInputError"]


class RewardError(Exception):
    """Root of every error this package raises."""


class RewardConfigError(RewardError, ValueError):
    """A configuration value (args attribute, reward name, custom function path) is invalid."""


class RewardInputError(RewardError, ValueError):
    """A sample does not carry what the reward function needs."""
