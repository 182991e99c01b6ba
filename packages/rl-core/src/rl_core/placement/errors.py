"""Why a layout was refused, kept apart so args, plan and realisation raise the same types.

A ``PlacementError`` is the user's to fix (wrong flags): the CLI turns it into exit status 2. A
``PlacementUnavailableError`` is the cluster's (not enough GPUs came up in time): the flags may be
right, the cluster is not.
"""

from __future__ import annotations

__all__ = ["PlacementError", "PlacementUnavailableError"]


class PlacementError(ValueError):
    """An invalid layout; the message shows the flags, the arithmetic and the valid layouts."""


class PlacementUnavailableError(RuntimeError):
    """The cluster could not give the plan's placement groups (or put them on it) in time."""
