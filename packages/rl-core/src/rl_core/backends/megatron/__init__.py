"""The Megatron-core training backend (``--train-backend megatron``), an optional extra.

Nothing here imports megatron-core at module import time except ``backend`` (and the helpers it
builds the model with), so ``rl_core`` stays importable without the extra and the flags and the
pure conversions can be checked on any machine. Call :func:`require_megatron` at config time to
fail before anything starts when the extra is missing.
"""

from __future__ import annotations

import importlib.util
import warnings

#: The pip extra that brings megatron-core; named in every "not installed" error.
MEGATRON_EXTRA = "genrm-rl-core[megatron]"

# megatron-core warns four times on import when Transformer Engine and Apex are missing, before
# anything of the run is printed (its flag errors included); the run says it once, in
# :func:`kernels_note`. Set here, in the package every megatron import goes through (the flag
# checks in the driver, the backend in each trainer actor).
warnings.filterwarnings(
    "ignore", message="Transformer Engine and Apex are not installed", category=UserWarning
)


def kernels_note() -> str | None:
    """What a Megatron run without Transformer Engine computes with (None when it has it)."""
    if importlib.util.find_spec("transformer_engine") is not None:
        return None
    return (
        "Megatron without Transformer Engine / Apex: local kernels and torch optimizers "
        "(install transformer-engine for fused kernels)"
    )


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


__all__ = ["MEGATRON_EXTRA", "MegatronNotInstalledError", "kernels_note", "require_megatron"]
