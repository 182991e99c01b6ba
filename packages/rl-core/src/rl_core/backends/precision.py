"""The training backend's precision rule: bf16 autocast only where the device has native bf16.

One rule for the judge engine and the trainer, owned by ``genrm_serve.precision`` (rl-core
depends on genrm-serve, not the other way round); see there for why.
"""

from __future__ import annotations

from genrm_serve import CpuBf16Probe, probe_cpu_bf16, resolve_bf16

__all__ = ["CpuBf16Probe", "probe_cpu_bf16", "resolve_bf16"]
