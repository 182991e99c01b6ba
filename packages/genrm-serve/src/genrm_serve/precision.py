"""Which float precision a device computes fast: bf16 only where the hardware does it natively.

A CPU without bf16 instructions (AVX2-only x86, most CI runners) emulates every bf16 matmul:
measured over 100x slower than fp32 there, which turned a 10-20 s train step into 200 s. So on a
CPU bf16 autocast is used only when the CPU has native bf16 (x86 ``avx512_bf16`` / ``amx_bf16``,
aarch64 ``bf16``); asking for it on a CPU without falls back to fp32 and says why, once.

It lives in genrm-serve (the hf judge engine picks its weights' dtype by it) and rl-core's
training backend uses the same rule through ``rl_core.backends.precision``. torch is imported
only when a device is decided: genrm-serve itself does not depend on it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["CpuBf16Probe", "probe_cpu_bf16", "resolve_bf16"]

logger = logging.getLogger(__name__)

#: ``/proc/cpuinfo`` flags (x86 ``flags``, aarch64 ``Features``) that mean native bf16 math.
NATIVE_BF16_FLAGS: frozenset[str] = frozenset({"avx512_bf16", "amx_bf16", "bf16"})

_CPUINFO = Path("/proc/cpuinfo")
_warned: set[str] = set()


@dataclass(frozen=True)
class CpuBf16Probe:
    """What the probe saw: torch's vector ISA and the native bf16 flags the CPU lists."""

    capability: str
    bf16_flags: frozenset[str]

    @property
    def native(self) -> bool:
        return bool(self.bf16_flags)

    def describe(self) -> str:
        flags = ", ".join(sorted(self.bf16_flags)) or "none of " + "/".join(
            sorted(NATIVE_BF16_FLAGS)
        )
        return f"CPU capability {self.capability}, native bf16 flags: {flags}"


def _cpu_flags(cpuinfo: Path) -> frozenset[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    flags: set[str] = set()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags)


@lru_cache(maxsize=1)
def probe_cpu_bf16() -> CpuBf16Probe:
    """Probe this machine's CPU once (torch's capability string and ``/proc/cpuinfo``)."""
    import torch

    return CpuBf16Probe(
        capability=torch.backends.cpu.get_cpu_capability(),
        bf16_flags=_cpu_flags(_CPUINFO) & NATIVE_BF16_FLAGS,
    )


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


def resolve_bf16(
    requested: bool | None,
    device: torch.device | str,
    *,
    probe: CpuBf16Probe | None = None,
    what: str = "--bf16",
) -> tuple[bool, str]:
    """Whether to compute in bf16 on ``device``, and why (the reason goes into the run summary).

    Args:
        requested: ``True`` (``--bf16``), ``False`` (``--no-bf16``), or ``None`` = auto: bf16
            where the device has it natively.
        device: where the math runs.
        probe: the CPU's capabilities (tests pass a fake); default: probe this machine.
        what: the setting that asked for bf16, named in the warning.
    """
    import torch

    device = torch.device(device)
    if requested is False:
        return False, "fp32 (bf16 off)"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return True, "bf16 autocast (the GPU supports bf16)"
        reason = "fp32: this GPU has no bf16 support"
    elif device.type == "cpu":
        cpu = probe or probe_cpu_bf16()
        if cpu.native:
            return True, f"bf16 autocast ({cpu.describe()})"
        reason = f"fp32: this CPU has no native bf16, so bf16 would be emulated ({cpu.describe()})"
    else:
        return bool(requested), f"{'bf16 autocast' if requested else 'fp32'} (device {device})"
    if requested:
        _warn_once(f"{what} ignored: {reason}; use a CPU with avx512_bf16/amx_bf16 or a GPU")
    return False, reason
