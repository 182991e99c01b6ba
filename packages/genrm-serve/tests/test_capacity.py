"""A placement that can never start is refused at once with the numbers; ``run`` stops on a
signal at any moment and takes down what it started (real ``genrm-serve run`` processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from genrm_serve.capacity import CapacityError, check_fits, standalone_needs, sum_resources
from genrm_serve.cli import _HealthProgress
from genrm_serve.config import build_instances
from genrm_serve.testing import lines_until


@pytest.mark.parametrize(
    ("needed", "total", "short"),
    [
        pytest.param({"CPU": 2.0}, {"CPU": 2.0}, [], id="exactly-fits"),
        pytest.param({"CPU": 2.1}, {"CPU": 2.0}, ["CPU: needs 2.1, the cluster has 2"], id="cpu"),
        pytest.param(
            {"CPU": 1.0, "GPU": 2.0},
            {"CPU": 8.0},
            ["GPU: needs 2, the cluster has 0"],
            id="no-gpu-at-all",
        ),
        pytest.param(
            {"CPU": 9.0, "GPU": 16.0},
            {"CPU": 8.0, "GPU": 8.0},
            ["CPU: needs 9, the cluster has 8", "GPU: needs 16, the cluster has 8"],
            id="both",
        ),
        pytest.param({"CPU": 0.3}, {"CPU": 0.1 + 0.2}, [], id="float-rounding"),
    ],
)
def test_check_fits_names_every_short_resource(
    needed: dict[str, float], total: dict[str, float], short: list[str]
) -> None:
    if not short:
        check_fits(needed, total, "the judges")
        return
    with pytest.raises(CapacityError) as info:
        check_fits(needed, total, "the judges", hint="Use fewer GPUs")
    message = str(info.value)
    assert message.startswith("the judges can never be placed: ")
    for part in short:
        assert part in message
    assert message.count("needs") == len(short)
    assert message.endswith(". Use fewer GPUs")


def test_standalone_needs_counts_every_engine_and_the_ingress() -> None:
    instances = build_instances(
        instances={
            "q": {"model_path": "/models/q", "num_gpus": 4, "num_gpus_per_engine": 2},
            "s": {"model_path": "/models/s", "num_gpus": 1},
            # the scripted engine computes on no GPU: it asks for none, also beside GPUs
            "t": {"model_path": "scripted", "num_gpus": 1, "engine": "scripted"},
        },
        engine="hf",
    )
    per, total = standalone_needs(
        instances, cluster_has_gpus=True, engine_num_cpus=1.0, ingress_num_cpus=0.1
    )
    assert per["q"] == [{"CPU": 1.0, "GPU": 2.0}] * 2
    assert per["s"] == [{"CPU": 1.0, "GPU": 1.0}]
    assert per["t"] == [{"CPU": 1.0}]
    assert total == pytest.approx({"CPU": 4.1, "GPU": 5.0})
    _, cpu_only = standalone_needs(
        instances, cluster_has_gpus=False, engine_num_cpus=0.5, ingress_num_cpus=0.1
    )
    assert cpu_only == pytest.approx({"CPU": 2.1})
    assert sum_resources([]) == {}


def test_health_progress_is_one_line_every_period_off_a_terminal() -> None:
    lines: list[str] = []

    class Sink:
        def write(self, text: str) -> None:
            lines.append(text)

        def flush(self) -> None:
            pass

    progress = _HealthProgress(Sink())
    body = {
        "status": "unhealthy",
        "instances": {
            "q": {
                "status": "unhealthy",
                "engines_total": 2,
                "engines_healthy": 0,
                "detail": "q/0: starting (loading the model)",
            }
        },
    }
    for tick in range(0, 61):  # two polls a second for 30 s
        progress(tick / 2, body)
    printed = [ln for ln in lines if ln.strip()]
    assert len(printed) == 2, printed  # at 15 s and 30 s, not 60 lines
    assert "q: unhealthy 0/2 engines [q/0: starting (loading the model)]" in printed[0]


def _run_cmd(port: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "genrm_serve.cli",
        "run",
        "--port",
        str(port),
        "--genrm-engine",
        "scripted",
        *extra,
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "GENRM_API_KEY": "", "PYTHONUNBUFFERED": "1"}


@pytest.mark.slow
def test_a_placement_that_can_never_fit_exits_2_at_once(unused_port: int) -> None:
    start = time.monotonic()
    proc = subprocess.run(
        _run_cmd(
            unused_port,
            "--genrm-instances",
            '{"q": {"model_path": "scripted", "num_gpus": 2}}',
            "--num-cpus",
            "1",
        ),
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "CPU: needs 2.1, the cluster has 1" in proc.stderr
    assert "--engine-num-cpus" in proc.stderr and "--num-cpus" in proc.stderr
    assert "deployed" not in proc.stdout
    # Ray's start-up (7-10 s here) is most of it; nothing waits for the placement group.
    assert elapsed < 60, elapsed


def _children(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (Ray's gcs_server, raylet and workers)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    out: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier} - out
        out |= frontier
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_sigterm_while_waiting_for_health_ends_run_and_its_ray(unused_port: int) -> None:
    # Engines that are still loading (a start that takes ten minutes): `run` is inside its wait
    # for health. An engine that fails its probes would be re-created and then refused, which
    # ends `run` on its own, and on a fast machine before the signal is sent.
    proc = subprocess.Popen(
        _run_cmd(
            unused_port,
            "--genrm-model-path",
            'scripted:{"start_delay_s": 600}',
            "--num-cpus",
            "2",
            "--engine-num-cpus",
            "0.1",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        lines = lines_until(proc.stdout, "waiting for the engines to load")
        assert lines and lines[-1].startswith("waiting for the engines"), "".join(lines[-30:])
        time.sleep(2.0)  # inside the health wait
        ray_processes = _children(proc.pid)
        assert ray_processes, "no Ray processes under `genrm-serve run`"
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, "".join(lines[-20:]) + out[-3000:]
    assert "stopping (SIGTERM)" in out and "shutting down" in out
    assert took < 15, f"SIGTERM took {took:.1f}s to end `genrm-serve run`"
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in ray_processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in ray_processes if _alive(p)]
    assert not left, f"Ray processes left behind: {left}"
