"""A CPU engine's weight snapshot never outlives it for long: an engine killed without its
shutdown (a run's teardown removes its placement groups, which kills the actors in them) leaves
its snapshot, 512 MB for the embedded model, and the next engine that starts on the host removes
it. Snapshots of live processes, and of other hosts sharing the temp dir, stay."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from genrm_serve.config import EngineConfig, InstanceSpec
from genrm_serve.engines.hf import HFEngine
from genrm_serve.engines.hf.snapshot import PREFIX
from genrm_serve.testing import build_tiny_model

#: an engine that saves its snapshot (weights updated, then asleep) and is killed as Ray kills
KILLED_ENGINE = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    import torch
    from genrm_serve.config import EngineConfig, InstanceSpec
    from genrm_serve.engines.hf import HFEngine

    async def main():
        spec = InstanceSpec(route_key="judge", model_path=sys.argv[1], num_gpus=1, engine="hf",
                            engine_config=EngineConfig(device="cpu", dtype="float32"))
        eng = HFEngine(spec, "judge/0")
        await eng.start()
        new = {n: p.detach() + 0.1 for n, p in eng.model.named_parameters()}
        await eng.update_weights(new, version=1)
        await eng.sleep()
        os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main())
    """
)


def _snapshots(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.name.startswith(PREFIX))


def _spec(model_dir: Path) -> InstanceSpec:
    return InstanceSpec(
        route_key="judge",
        model_path=str(model_dir),
        num_gpus=1,
        engine="hf",
        engine_config=EngineConfig(device="cpu", dtype="float32"),
    )


async def test_a_killed_engines_snapshot_is_removed_by_the_next_engine_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny = build_tiny_model(tmp_path / "tiny")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    killed = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", KILLED_ENGINE, str(tiny)],
        env=dict(os.environ) | {"TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    (left,) = _snapshots(tmp)
    assert (left / "config.json").is_file()  # the killed engine's weights, left behind
    dead_pid = left.name.removeprefix(PREFIX).split("-")[-2]
    other_host = tmp / f"{PREFIX}another_host-{dead_pid}-abc"  # its pid is not this host's
    other_host.mkdir()
    unrelated = tmp / "genrm-something-else"
    unrelated.mkdir()

    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    live = HFEngine(_spec(tiny), "judge/1")
    await live.start()
    try:
        assert not left.exists()
        assert other_host.exists() and unrelated.exists()
        await live.update_weights(
            {n: p.detach() * 1.01 for n, p in live.model.named_parameters()}, version=1
        )
        await live.sleep()
        (mine,) = set(_snapshots(tmp)) - {other_host}
        again = HFEngine(_spec(tiny), "judge/2")
        await again.start()  # another engine starting: a live engine's snapshot stays
        await again.shutdown()
        assert mine.exists()
        await live.wake()  # from that snapshot
        assert live.weight_version == 1
    finally:
        await live.shutdown()
    assert not mine.exists()  # a shutdown removes its own
