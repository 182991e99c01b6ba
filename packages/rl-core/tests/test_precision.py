"""The trainer's autocast follows the CPU's native bf16 (probe faked); the demo asks for auto."""

import pytest

from genrm_serve import precision
from genrm_serve.precision import CpuBf16Probe
from rl_core.backends.base import BackendConfig
from rl_core.backends.torch_hf import TorchHFBackend
from rl_core.config import parse_train_args

AVX2 = CpuBf16Probe(capability="AVX2", bf16_flags=frozenset())
NATIVE = CpuBf16Probe(capability="AVX512", bf16_flags=frozenset({"avx512_bf16"}))


@pytest.mark.parametrize(
    ("probe", "bf16", "on", "summary"),
    [
        pytest.param(AVX2, True, False, "fp32: this CPU has no native bf16", id="forced-avx2"),
        pytest.param(AVX2, None, False, "fp32: this CPU has no native bf16", id="auto-avx2"),
        pytest.param(NATIVE, None, True, "bf16 autocast", id="auto-native"),
        pytest.param(NATIVE, False, False, "fp32 (bf16 off)", id="off"),
    ],
)
def test_backend_autocast_follows_the_probe(monkeypatch, tiny_model_path, probe, bf16, on, summary):
    monkeypatch.setattr(precision, "probe_cpu_bf16", lambda: probe)
    backend = TorchHFBackend(tiny_model_path, BackendConfig(bf16=bf16))
    assert backend.bf16 is on
    assert backend._autocast()._enabled is on
    assert backend.precision.startswith(summary)


def test_cpu_demo_asks_for_auto_and_the_flag_still_forces():
    demo, _ = parse_train_args(["--preset", "cpu-demo"])
    assert demo.bf16 is None
    forced, _ = parse_train_args(["--preset", "cpu-demo", "--bf16"])
    assert forced.bf16 is True
    off, _ = parse_train_args(["--preset", "cpu-demo", "--no-bf16"])
    assert off.bf16 is False


def test_the_summary_says_which_precision_was_used():
    from rich.console import Console

    from rl_core.summary import render_summary

    console = Console(record=True, width=100)
    render_summary(
        [], mode="colocate", precision="fp32: this CPU has no native bf16", console=console
    )
    assert "training precision: fp32: this CPU has no native bf16" in console.export_text()
