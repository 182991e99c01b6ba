"""The Megatron-core training backend (``--train-backend megatron``), an optional extra.

Nothing here imports megatron-core at module import time except ``backend`` (and the helpers it
builds the model with), so ``rl_core`` stays importable without the extra and the flags and the
pure conversions can be checked on any machine. Call :func:`require_megatron` at config time to
fail before anything starts when the extra is missing.
"""

from __future__ import annotations

#: The pip extra that brings megatron-core; named in every "not installed" error.
MEGATRON_EXTRA = "genrm-rl-core[megatron]"


class MegatronNotInstalledError(ImportError):
    """``--train-backend megatron`` without megatron-core installed."""


def require_megatron() -> str:
    """Check megatron-core is importable; returns its version, or raises naming the extra."""
    try:
        from megatron.core import package_info
    except ImportError as e:
        raise MegatronNotInstalledError(
            f"--train-backend megatron needs megatron-core, which is not installed ({e}); "
            f"install the extra: pip install '{MEGATRON_EXTRA}'"
        ) from e
    return str(package_info.__version__)


__all__ = ["MEGATRON_EXTRA", "MegatronNotInstalledError", "require_megatron"]
