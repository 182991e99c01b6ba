"""bf16 only where the device computes it natively, probed, never assumed (CPU probe faked)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from genrm_serve import precision
from genrm_serve.precision import CpuBf16Probe, resolve_bf16

AVX2 = CpuBf16Probe(capability="AVX2", bf16_flags=frozenset())
AVX512_NO_BF16 = CpuBf16Probe(capability="AVX512", bf16_flags=frozenset())
SAPPHIRE = CpuBf16Probe(capability="AVX512", bf16_flags=frozenset({"avx512_bf16", "amx_bf16"}))


@pytest.mark.parametrize(
    ("probe", "requested", "bf16", "reason"),
    [
        pytest.param(AVX2, None, False, "no native bf16", id="auto-avx2-fp32"),
        pytest.param(AVX2, True, False, "no native bf16", id="forced-avx2-fp32"),
        pytest.param(AVX512_NO_BF16, None, False, "CPU capability AVX512", id="avx512-no-bf16"),
        pytest.param(SAPPHIRE, None, True, "avx512_bf16", id="auto-native-bf16"),
        pytest.param(SAPPHIRE, True, True, "amx_bf16", id="forced-native-bf16"),
        pytest.param(SAPPHIRE, False, False, "bf16 off", id="off-stays-off"),
    ],
)
def test_cpu_bf16_follows_the_probe(
    probe: CpuBf16Probe, requested: bool | None, bf16: bool, reason: str
) -> None:
    got, why = resolve_bf16(requested, "cpu", probe=probe)
    assert got is bf16
    assert reason in why
    assert why.startswith("bf16" if bf16 else "fp32")


def test_forcing_bf16_on_a_cpu_without_it_warns_once_with_the_reason(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precision, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="genrm_serve.precision"):
        for _ in range(3):
            resolve_bf16(True, "cpu", probe=AVX2)
        resolve_bf16(None, "cpu", probe=AVX2)  # auto on such a CPU is no mistake: no warning
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "--bf16 ignored" in warnings[0] and "CPU capability AVX2" in warnings[0]


def test_cpuinfo_flags_are_read_for_x86_and_aarch64(tmp_path: Path) -> None:
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 sve\n")
    plain = tmp_path / "plain"
    plain.write_text("processor\t: 0\nflags\t\t: fpu sse avx avx2 fma\n")
    assert precision._cpu_flags(x86) & precision.NATIVE_BF16_FLAGS == {"avx512_bf16"}
    assert precision._cpu_flags(arm) & precision.NATIVE_BF16_FLAGS == {"bf16"}
    assert not precision._cpu_flags(plain) & precision.NATIVE_BF16_FLAGS
    assert precision._cpu_flags(tmp_path / "missing") == frozenset()


def test_this_machine_is_probed_from_torch_and_cpuinfo() -> None:
    probe = precision.probe_cpu_bf16()
    assert probe.capability == torch.backends.cpu.get_cpu_capability()
    assert probe.bf16_flags <= precision.NATIVE_BF16_FLAGS
