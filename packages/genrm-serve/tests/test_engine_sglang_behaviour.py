"""The SGLang engine against what SGLang's source does, one test per behaviour it must handle.

``FakeSGLangEngine`` models each behaviour (its docstrings name the SGLang file and function);
every test here failed on the engine written against the fake that did not model them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from genrm_client.types import SamplingParams
from genrm_serve import limits
from genrm_serve.config import DEFAULT_SAMPLING, EngineConfig, InstanceSpec
from genrm_serve.engines import worker as worker_mod
from genrm_serve.engines.base import (
    EngineBatchError,
    EngineError,
    EngineOutput,
    EngineRequest,
    PromptTooLongError,
)
from genrm_serve.engines.sglang import (
    ENGINE_ENV,
    MEMORY_TAGS,
    SGLangEngine,
    SGLangPlacement,
    device_kwargs,
    engine_actor_options,
    launch,
    sglang_sampling_params,
)
from genrm_serve.engines.sglang.prefix_warmup import WarmupPolicy
from genrm_serve.engines.worker import EngineWorker, create_engine_worker
from genrm_serve.testing import FakeSGLangEngine, build_tiny_model

CONTEXT = 64  # max_context_len of the engines here: SGLang's max_req_input_len is 64 - 1 - 5


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def _spec(model_dir: Path | str = "/m", per_engine: int = 1, **engine_config: Any) -> InstanceSpec:
    return InstanceSpec(
        route_key="judge",
        model_path=str(model_dir),
        num_gpus=per_engine,
        num_gpus_per_engine=per_engine,
        engine="sglang",
        engine_config=EngineConfig(max_context_len=CONTEXT, **engine_config),
    )


def _req(n_tokens: int, first: int = 10, **sampling: Any) -> EngineRequest:
    """A request of exactly ``n_tokens`` prompt tokens (ids inside the tiny vocabulary)."""
    sampling.setdefault("max_response_len", 4)
    return EngineRequest(
        sampling=SamplingParams(**sampling).merged_over(DEFAULT_SAMPLING),
        prompt_token_ids=[first + i % 50 for i in range(n_tokens)],
        return_tokens=True,
    )


Started = tuple[SGLangEngine, FakeSGLangEngine]


@pytest.fixture
async def start(tiny_dir: Path) -> AsyncIterator[Any]:
    """``await start(**engine_config)`` → a started engine over the fake; shut down after."""
    engines: list[SGLangEngine] = []

    async def make(
        per_engine: int = 1, placement: SGLangPlacement | None = None, **engine_config: Any
    ) -> Started:
        where = {"placement": placement} if placement is not None else {}
        engine = SGLangEngine(
            _spec(tiny_dir, per_engine, **engine_config),
            "judge/0",
            engine_cls=FakeSGLangEngine,
            **where,
        )
        engines.append(engine)
        await engine.start()
        return engine, engine.sgl

    yield make
    for engine in engines:
        await engine.shutdown()


# -- 1. sleep / wake keeps a judge's weights -----------------------------------------------------
async def test_without_the_cpu_backup_the_same_engine_wakes_on_fresh_weights(
    start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the engine asks for ``enable_weights_cpu_backup``: the same sleep / wake with the flag
    taken out of its launch arguments resumes onto fresh pages, and greedy answers change (the
    wake check, which would fail such a wake, is off to see them: ``test_wake_check.py``)."""
    monkeypatch.setattr(FakeSGLangEngine, "step_s", 0.0)
    real_kwargs = launch.sglang_engine_kwargs

    def without_backup(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**real_kwargs(*args, **kwargs), "enable_weights_cpu_backup": False}

    monkeypatch.setattr(launch, "sglang_engine_kwargs", without_backup)
    engine, fake = await start(wake_check=False)
    before = (await engine.generate([_req(12, temperature=0.0)]))[0].token_ids
    await engine.sleep()
    assert "weights" in fake.offload_tags
    await engine.wake()
    after = (await engine.generate([_req(12, temperature=0.0)]))[0].token_ids
    assert engine.state == "awake" and not fake.offload_tags
    assert after != before and not fake.weights_valid


async def test_sleep_wake_keeps_the_judges_weights(
    start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakeSGLangEngine, "step_s", 0.0)  # weights only (flush: item 2)
    engine, fake = await start()
    before = (await engine.generate([_req(12, temperature=0.0)]))[0].token_ids
    await engine.sleep()
    await engine.wake()
    after = (await engine.generate([_req(12, temperature=0.0)]))[0].token_ids
    assert after == before and fake.weights_valid
    assert fake.server_args["enable_weights_cpu_backup"] is True


async def test_a_judge_that_keeps_its_weights_releases_only_the_cache(
    start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sleep_keeps_weights``: the KV cache and CUDA graphs are released, the weights stay
    (no CPU backup is made, none is needed), and greedy outputs are the same after wake."""
    monkeypatch.setattr(FakeSGLangEngine, "step_s", 0.0)
    engine, fake = await start(sleep_keeps_weights=True)
    before = (await engine.generate([_req(12, temperature=0.0)]))[0].token_ids
    await engine.sleep()
    assert fake.offload_tags == {"kv_cache", "cuda_graph"}
    await engine.wake()
    after = (await engine.generate([_req(12, temperature=0.0)]))[0].token_ids
    assert after == before and fake.weights_valid and not fake.offload_tags
    assert fake.server_args["enable_weights_cpu_backup"] is False


# -- 2. flush_cache retried until it succeeds, under a deadline ----------------------------------
async def test_sleep_retries_flush_until_sglang_is_idle(
    start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakeSGLangEngine, "step_s", 0.6)
    monkeypatch.setattr(limits, "SGLANG_FLUSH_RETRY_S", 0.2)
    engine, fake = await start()
    await engine.generate([_req(5)])
    await engine.sleep()  # right after a request: it is still in SGLang's running batch
    assert fake.calls.count("flush_cache") >= 2 and engine.stats()["flush_retries"] >= 1
    assert not fake.dead and fake.released == set(MEMORY_TAGS)


async def test_sleep_gives_up_after_the_flush_deadline(
    start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakeSGLangEngine, "step_s", 30.0)
    monkeypatch.setattr(limits, "SGLANG_FLUSH_DEADLINE_S", 0.3)
    monkeypatch.setattr(limits, "SGLANG_FLUSH_RETRY_S", 0.1)
    engine, fake = await start()
    await engine.generate([_req(5)])
    with pytest.raises(EngineError, match="flush_cache still failing"):
        await engine.sleep()
    assert "release_memory_occupation" not in fake.calls and not fake.dead
    assert engine.state == "awake"


# -- 3. context limits from get_server_info; over-long prompts refused per request ----------------
async def test_limits_come_from_the_running_sglang(start: Any) -> None:
    engine, fake = await start()
    assert "get_server_info" in fake.calls
    # max_req_input_len = CONTEXT - 6, and a prompt of that many tokens is aborted (0.5.17)
    assert (engine.context_len, engine.prompt_limit) == (CONTEXT, CONTEXT - 7)
    ok = await engine.generate([_req(CONTEXT - 7, max_response_len=100)])
    # prompt + new tokens stay below context_len
    assert ok[0].finish_reason in {"stop", "length"} and ok[0].extra.get("abort") is None
    for n in (CONTEXT - 6, CONTEXT - 1, CONTEXT):
        with pytest.raises(PromptTooLongError, match="max_req_input_len=58"):
            await engine.generate([_req(n)])


async def test_one_over_long_prompt_does_not_fail_its_batch(start: Any) -> None:
    engine, _fake = await start()
    with pytest.raises(EngineBatchError) as info:
        await engine.generate([_req(10), _req(CONTEXT - 4), _req(20)])
    first, long, last = info.value.results
    assert isinstance(first, EngineOutput) and isinstance(last, EngineOutput)
    assert isinstance(long, PromptTooLongError) and long.prompt_tokens == CONTEXT - 4


async def test_the_worker_answers_413_for_one_and_serves_the_others(tiny_dir: Path) -> None:
    engine = SGLangEngine(_spec(tiny_dir), "judge/0", engine_cls=FakeSGLangEngine)
    worker = EngineWorker(_spec(tiny_dir), 0, engine=engine, batch_wait_s=0.05)
    await worker.start()
    try:
        results = await asyncio.gather(
            worker.generate(_req(10)),
            worker.generate(_req(CONTEXT - 2)),
            worker.generate(_req(30)),
            return_exceptions=True,
        )
        stats = await worker.stats()
    finally:
        await worker.shutdown()
    assert isinstance(results[0], EngineOutput) and isinstance(results[2], EngineOutput)
    assert isinstance(results[1], PromptTooLongError)
    assert stats["batches"] == 1 and stats["max_batch"] == 3  # one batch: nothing re-run


# -- 4. any per-request SGLang error stays with its request --------------------------------------
async def test_a_request_sglang_refuses_fails_alone(start: Any) -> None:
    engine, _fake = await start()
    bad = _req(6, first=100_000)  # token ids beyond the vocabulary: SGLang raises ValueError
    with pytest.raises(EngineBatchError) as info:
        await engine.generate([_req(8), bad, _req(9)])
    good1, err, good2 = info.value.results
    assert isinstance(good1, EngineOutput) and isinstance(good2, EngineOutput)
    assert isinstance(err, EngineError) and "vocab size" in str(err)  # SGLang's words
    with pytest.raises(EngineError, match="vocab size"):
        await engine.generate([bad])  # alone: its own error, not a batch error


# -- 5. per-request seed: honoured with deterministic inference, else refused ---------------------
async def test_seed_needs_deterministic_inference(start: Any) -> None:
    engine, fake = await start()
    with pytest.raises(EngineError, match="deterministic_inference=true"):
        await engine.generate([_req(8, temperature=0.7, seed=3)])
    assert "enable_deterministic_inference" not in fake.server_args
    greedy = await engine.generate([_req(8, temperature=0.0, seed=3)])  # greedy: seed moot
    assert greedy[0].completion_tokens > 0


async def test_seed_is_honoured_with_deterministic_inference(start: Any) -> None:
    engine, fake = await start(deterministic_inference=True)
    assert fake.server_args["enable_deterministic_inference"] is True

    async def tokens(seed: int) -> list[int]:
        out = await engine.generate([_req(8, temperature=0.9, seed=seed, max_response_len=4)])
        return list(out[0].token_ids or [])

    assert await tokens(3) == await tokens(3)
    assert await tokens(3) != await tokens(4)


# -- 6. top_k <= 0 means off: sent as -1 ---------------------------------------------------------
async def test_top_k_zero_is_off(start: Any) -> None:
    assert sglang_sampling_params(SamplingParams(top_k=0, temperature=1.0), 4)["top_k"] == -1
    engine, _fake = await start()
    out = await engine.generate([_req(8, temperature=0.8, top_k=0)])
    assert out[0].completion_tokens > 0


# -- 7. multi-GPU engines: devices from the placement ---------------------------------------------
@pytest.mark.parametrize(
    ("gpus", "assigned", "noset", "expected"),
    [
        pytest.param(1, [3], False, {"base_gpu_id": 0, "gpu_id_step": 1}, id="ray-renumbered"),
        pytest.param(2, [4], True, {"base_gpu_id": 4, "gpu_id_step": 1}, id="first-bundle"),
        pytest.param(2, [3, 2], True, {"base_gpu_id": 2, "gpu_id_step": 1}, id="whole-bundle"),
        pytest.param(4, [1, 3, 5, 7], True, {"base_gpu_id": 1, "gpu_id_step": 2}, id="stepped"),
    ],
)
def test_device_kwargs(
    gpus: int, assigned: list[int], noset: bool, expected: dict[str, int]
) -> None:
    assert device_kwargs(gpus, assigned, sees_all_gpus=noset) == expected


@pytest.mark.parametrize(
    ("gpus", "assigned", "noset", "placement", "message"),
    [
        pytest.param(2, [0], False, None, "sees 1", id="one-visible-gpu"),
        pytest.param(3, [0, 1, 5], True, None, "not evenly spaced", id="uneven"),
        pytest.param(8, [0], True, SGLangPlacement(nnodes=2), "dist_init_addr", id="no-addr"),
    ],
)
def test_device_kwargs_errors(
    gpus: int, assigned: list[int], noset: bool, placement: SGLangPlacement | None, message: str
) -> None:
    with pytest.raises(EngineError, match=message):
        device_kwargs(gpus, assigned, sees_all_gpus=noset, placement=placement)


async def test_a_two_gpu_engine_drives_its_bundles_gpus(
    start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setattr(launch, "_assigned_gpus", lambda: [6])  # its first bundle
    _engine, fake = await start(per_engine=2, mem_fraction_static=0.4)
    assert (fake.server_args["base_gpu_id"], fake.server_args["gpu_id_step"]) == (6, 1)
    assert fake.devices == [6, 7] and fake.server_args["tp_size"] == 2


async def test_node_rank_one_of_a_two_node_engine(
    start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_BLOCK_NONZERO_RANK_CHILDREN", "1")
    where = SGLangPlacement(base_gpu_id=0, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000")
    engine, fake = await start(per_engine=16, placement=where)
    assert fake.server_args["nnodes"] == 2 and fake.server_args["node_rank"] == 1
    assert fake.devices == list(range(8))  # 8 of the engine's 16 GPUs on this node
    with pytest.raises(EngineError, match="node_rank 0 serves"):
        await engine.generate([_req(5)])
    await engine.sleep()  # rank 0's release reaches this node's schedulers
    assert engine.state == "asleep" and "release_memory_occupation" not in fake.calls


def test_create_engine_worker_gives_sglang_actors_all_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    seen: dict[str, Any] = {}

    class Recorder:
        def options(self, **options: Any) -> Recorder:
            seen.update(options)
            return self

        def remote(self, *args: Any, **kwargs: Any) -> str:
            return "handle"

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(worker_mod, "_cluster_has_gpus", lambda: True)
    monkeypatch.setattr(worker_mod, "_remote_worker_class", lambda: Recorder())
    spec = _spec(per_engine=2, python_executable="/envs/sglang/bin/python")
    assert create_engine_worker(spec, 0) == "handle"
    assert seen["num_gpus"] == 2.0
    env = seen["runtime_env"]["env_vars"]
    assert env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"
    assert env["SGLANG_MEMORY_SAVER_CUDA_GRAPH"] == "true"
    assert seen["runtime_env"]["py_executable"] == "/envs/sglang/bin/python"


def test_python_executable_applies_to_any_engine_and_env_only_to_sglang() -> None:
    hf = _spec(python_executable="/envs/x/bin/python").model_copy(update={"engine": "hf"})
    assert engine_actor_options(hf) == {"runtime_env": {"py_executable": "/envs/x/bin/python"}}
    assert engine_actor_options(_spec()) == {"runtime_env": {"env_vars": dict(ENGINE_ENV)}}


@pytest.mark.slow
def test_ray_starts_an_sglang_engine_actor_with_its_options(tiny_dir: Path) -> None:
    from genrm_serve.testing import ray_test_env

    ray_test_env()
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:  # py_executable and env_vars are runtime_env keys this Ray accepts
        spec = _spec(tiny_dir, python_executable=sys.executable)
        handle = create_engine_worker(spec, 0, num_cpus=0.1)
        info = ray.get(handle.info.remote(), timeout=180)
        assert info["engine_id"] == "judge/0" and info["pid"] != os.getpid()
    finally:
        ray.shutdown()


# -- 8. health probes generation; a dead SGLang child is reported, not a silent death ------------
async def test_health_probe_catches_a_hung_sglang(
    start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "SGLANG_PROBE_TIMEOUT_S", 0.3)
    engine, fake = await start()
    await engine.check_health()  # probes: answers
    fake.hang = True
    await asyncio.sleep(0.35)  # past the last answer's window
    with pytest.raises(EngineError, match="health probe"):
        await engine.check_health()


_SIGQUIT_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys, threading
    from genrm_serve.config import EngineConfig, InstanceSpec
    from genrm_serve.engines.sglang import SGLangEngine
    from genrm_serve.testing import FakeSGLangEngine

    spec = InstanceSpec(route_key="judge", model_path=sys.argv[1], num_gpus=1, engine="sglang",
                        engine_config=EngineConfig(max_context_len=64))

    async def run():
        engine = SGLangEngine(spec, "judge/0", engine_cls=FakeSGLangEngine)
        await engine.start()
        engine.sgl.crash_scheduler()  # the scheduler dies and SIGQUITs this process
        await asyncio.sleep(1.5)
        try:
            await engine.check_health()
            print("HEALTHY")
        except Exception as err:
            print("REPORTED:", err, "| state:", engine.state)
        await engine.shutdown()

    if sys.argv[2] == "main":
        asyncio.run(run())
    else:  # as in a Ray async actor: not the main thread
        t = threading.Thread(target=lambda: asyncio.run(run()))
        t.start()
        t.join()
    print("SURVIVED")
    """
)


@pytest.mark.parametrize("thread", ["main", "other"], ids=["main-thread", "actor-thread"])
def test_a_dead_sglang_child_is_reported_not_a_silent_death(tiny_dir: Path, thread: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _SIGQUIT_SCRIPT, str(tiny_dir), thread],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "SURVIVED" in proc.stdout and "REPORTED:" in proc.stdout, proc.stdout
    assert "state: failed" in proc.stdout


# -- 9. SGLang's logging.basicConfig(force=True) does not wipe ours ------------------------------
async def test_our_logging_survives_sglang_start(start: Any) -> None:
    root = logging.getLogger()
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler, level = Keep(), root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        await start()
        assert handler in root.handlers and root.level == logging.INFO
        logging.getLogger("genrm_serve.tests").info("still ours")
        assert "still ours" in records
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


# -- 10. every request in flight reaches SGLang together (async_generate) ------------------------
async def test_concurrent_batches_reach_sglang_together(start: Any) -> None:
    engine, fake = await start()
    fake.gate = asyncio.Event()
    first = asyncio.ensure_future(engine.generate([_req(5), _req(6), _req(7)]))
    second = asyncio.ensure_future(engine.generate([_req(8), _req(9)]))
    for _ in range(500):  # up to 10 s for the requests to reach SGLang
        if fake.in_flight >= 5:
            break
        await asyncio.sleep(0.02)
    seen = fake.in_flight
    fake.loop.call_soon_threadsafe(fake.gate.set)
    outs = await asyncio.wait_for(asyncio.gather(first, second), 20)
    assert seen == 5 and [len(o) for o in outs] == [3, 2]
    assert "generate" not in fake.calls  # never the synchronous, one-batch-at-a-time call


# -- 11. CUDA-graph memory is released on sleep ---------------------------------------------------
async def test_sleep_releases_cuda_graph_memory(
    start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_MEMORY_SAVER_CUDA_GRAPH", "unset")
    monkeypatch.delenv("SGLANG_MEMORY_SAVER_CUDA_GRAPH")
    engine, fake = await start()
    assert fake.gpu_bytes_in_use() > 0
    await engine.sleep()
    assert "cuda_graph" in fake.released and fake.gpu_bytes_in_use() == 0
    await engine.wake()
    assert not fake.released and fake.gpu_bytes_in_use() > 0


# -- 12. mem_fraction_static passed; a shared GPU without it refused ------------------------------
async def test_mem_fraction_static_reaches_sglang(start: Any) -> None:
    _engine, fake = await start(mem_fraction_static=0.35)
    assert fake.server_args["mem_fraction_static"] == 0.35


def test_a_shared_gpu_without_mem_fraction_is_refused_before_the_actor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(worker_mod, "_cluster_has_gpus", lambda: True)
    monkeypatch.setattr(worker_mod, "_remote_worker_class", lambda: pytest.fail("created"))
    with pytest.raises(EngineError, match="mem_fraction_static is not set"):
        create_engine_worker(_spec(), 0, num_gpus=0.2, shared_gpu=True)
    assert engine_actor_options(_spec(mem_fraction_static=0.3), shared_gpu=True)
    assert engine_actor_options(_spec(), shared_gpu=False)  # split layouts: SGLang's default


# -- 13. dp_size maps to SGLang's dp-attention only when asked ------------------------------------
async def test_dp_size_without_dp_attention_is_refused(tiny_dir: Path) -> None:
    engine = SGLangEngine(_spec(tiny_dir, 4, dp_size=2), "judge/0", engine_cls=FakeSGLangEngine)
    with pytest.raises(EngineError, match="needs enable_dp_attention=true"):
        await engine.start()


# -- 14. starts on SGLang's defaults: prefill graphs off only because the memory saver needs it --
async def test_starts_where_sglang_s_breakable_prefill_graphs_refuse_the_memory_saver(
    start: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # 0.5.17's default prefill graphs ("breakable") kill the scheduler under the memory saver
    with caplog.at_level(logging.INFO, logger="genrm_serve.engines.sglang.launch"):
        engine, fake = await start()
    assert engine.state == "awake"
    assert fake.server_args["cuda_graph_backend_prefill"] == "disabled"
    assert "refuse the memory saver" in caplog.text  # we say why
    # nothing else of SGLang's defaults is overridden: no log level, no backends
    assert "log_level" not in fake.server_args and "attention_backend" not in fake.server_args


async def test_a_user_s_prefill_choice_is_kept_and_breakable_refused_before_start(
    start: Any, tiny_dir: Path
) -> None:
    _engine, fake = await start(server_args={"cuda_graph_backend_prefill": "tc_piecewise"})
    assert fake.server_args["cuda_graph_backend_prefill"] == "tc_piecewise"
    bad = SGLangEngine(
        _spec(tiny_dir, server_args={"cuda_graph_backend_prefill": "breakable"}),
        "judge/1",
        engine_cls=FakeSGLangEngine,
    )
    with pytest.raises(EngineError, match=r"breakable.*memory saver"):
        await bad.start()


# -- 15. a scheduler that dies while loading: an EngineError with its traceback, the host lives ---
class _DyingSGLang(FakeSGLangEngine):
    fail_at_start = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"


async def test_a_scheduler_dying_at_start_is_an_engine_error_with_its_traceback(
    tiny_dir: Path,
) -> None:
    engine = SGLangEngine(_spec(tiny_dir), "judge/0", engine_cls=_DyingSGLang)
    with pytest.raises(EngineError) as info:
        await engine.start()
    text = str(info.value)
    assert "did not start" in text and "scheduler died during initialization" in text
    assert "CUDA out of memory. Tried to allocate 20.00 GiB" in text  # SGLang's own line
    assert engine.state == "failed"
    # this process survived the child's SIGQUIT, and its stderr is its own again
    print("stderr still works", file=sys.stderr)


def test_the_same_in_a_plain_process_off_the_main_thread(tiny_dir: Path) -> None:
    """A plain script that starts the engine off the main thread (as a Ray async actor does):
    SIGQUIT is ignored there, and the error still carries the child's last lines."""
    script = textwrap.dedent(
        f"""
        import asyncio, threading
        from genrm_serve.config import EngineConfig, InstanceSpec
        from genrm_serve.engines.base import EngineError
        from genrm_serve.engines.sglang import SGLangEngine
        from genrm_serve.testing import FakeSGLangEngine

        class Dying(FakeSGLangEngine):
            fail_at_start = "RuntimeError: the scheduler refused this config"

        spec = InstanceSpec(route_key="j", model_path={str(tiny_dir)!r}, num_gpus=1,
                            engine="sglang", engine_config=EngineConfig(max_context_len=64))
        result = []
        def run():
            try:
                asyncio.run(SGLangEngine(spec, "j/0", engine_cls=Dying).start())
            except EngineError as err:
                result.append(str(err))
        t = threading.Thread(target=run); t.start(); t.join()
        assert "the scheduler refused this config" in result[0], result
        print("ALIVE")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ALIVE" in out.stdout


# -- 16. server arguments pass through, checked before the model loads ---------------------------
async def test_server_args_reach_sglang(start: Any) -> None:
    args = {
        "attention_backend": "triton",
        "sampling_backend": "pytorch",
        "chunked_prefill_size": 512,
    }
    _engine, fake = await start(server_args=args)
    assert {k: fake.server_args[k] for k in args} == args


async def test_an_unknown_server_arg_is_refused_with_its_closest_matches(tiny_dir: Path) -> None:
    engine = SGLangEngine(
        _spec(tiny_dir, server_args={"attention_backnd": "triton"}),
        "judge/0",
        engine_cls=FakeSGLangEngine,
    )
    with pytest.raises(EngineError, match="'attention_backnd' \\(closest: attention_backend"):
        await engine.start()
    assert engine.sgl is None  # refused before SGLang was built


def test_a_server_arg_we_own_is_refused_naming_our_setting() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"'mem_fraction_static'.*engine_config.mem_fraction"):
        EngineConfig(server_args={"mem_fraction_static": 0.5})
    with pytest.raises(ValidationError, match=r"'tp_size'.*num_gpus_per_engine"):
        EngineConfig(server_args={"tp_size": 2})


# -- 17. the worker hands SGLang every batch as it forms (continuous batching) -------------------
async def test_the_worker_does_not_wait_for_sglang_s_previous_batch(tiny_dir: Path) -> None:
    spec = _spec(tiny_dir, max_batch_size=2)
    engine = SGLangEngine(spec, "judge/0", engine_cls=FakeSGLangEngine)
    worker = EngineWorker(spec, 0, engine=engine, batch_wait_s=0.0)
    await worker.start()
    fake = engine.sgl
    try:
        fake.gate = asyncio.Event()
        calls = [
            asyncio.ensure_future(worker.generate_many([_req(5 + i), _req(9 + i)]))
            for i in range(4)
        ]
        for _ in range(500):
            if fake.in_flight >= 8:
                break
            await asyncio.sleep(0.02)
        seen = fake.in_flight  # four batches of two, all at SGLang at once
        assert (await worker.stats())["in_flight"] == 8
        fake.loop.call_soon_threadsafe(fake.gate.set)
        outs = await asyncio.wait_for(asyncio.gather(*calls), 20)
        assert seen == 8 and all(len(o) == 2 for o in outs)
        # sleep waits for batches in flight, then releases
        fake.gate = asyncio.Event()
        pending = asyncio.ensure_future(worker.generate(_req(7)))
        await asyncio.sleep(0.2)
        sleeping = asyncio.ensure_future(worker.sleep())
        await asyncio.sleep(0.2)
        assert not sleeping.done() and "release_memory_occupation" not in fake.calls
        fake.loop.call_soon_threadsafe(fake.gate.set)
        await asyncio.wait_for(asyncio.gather(pending, sleeping), 20)
        assert engine.state == "asleep"
    finally:
        await worker.shutdown()


# -- 18. a context longer than the model's is capped (SGLang refuses it, seen on 0.5.17) ----------
async def test_context_length_is_capped_at_the_model_s_positions(tiny_dir: Path) -> None:
    spec = InstanceSpec(
        route_key="judge",
        model_path=str(tiny_dir),
        num_gpus=1,
        engine="sglang",
        engine_config=EngineConfig(max_context_len=8192),  # the tiny model has 4096 positions
    )
    engine = SGLangEngine(spec, "judge/0", engine_cls=FakeSGLangEngine)
    await engine.start()
    try:
        assert engine.server_args["context_length"] == 4096 and engine.context_len == 4096
    finally:
        await engine.shutdown()


# -- 19. a GRPO group's shared prompt is computed once (SGLang caches finished prompts only) ------
async def test_shutting_down_one_engine_leaves_another_in_the_process_serving(
    start: Any,
) -> None:
    """SGLang's shutdown kills every child of its host process (seen on 0.5.17: a second
    engine's detokenizer died with -9 and that engine failed). Ours ends its own processes
    only, so two engines can share a process (a test, a benchmark, one actor per engine not
    being a rule a user must know)."""
    first, _ = await start()
    second, _ = await start()
    await second.shutdown()
    watch_s = limits.SGLANG_CHILD_WATCH_S
    await asyncio.sleep(watch_s * 1.5)  # the first's child watch would see a death
    assert first.state == "awake"
    out = (await first.generate([_req(20, temperature=0.0)]))[0]
    assert out.completion_tokens > 0


def _grouped(groups: int, per_group: int, shared: int, own: int) -> list[EngineRequest]:
    reqs = []
    for g in range(groups):
        head = [20 + g] + [30 + (g * 7 + i) % 40 for i in range(shared - 1)]
        for k in range(per_group):
            tail = [100 + (k * 13 + j) % 50 for j in range(own)]
            reqs.append(_req(0, max_response_len=1))
            reqs[-1].prompt_token_ids = head + tail
    return reqs


async def test_a_group_s_shared_prompt_is_computed_once(tiny_dir: Path) -> None:
    spec = _spec(tiny_dir)
    spec = spec.model_copy(
        update={"engine_config": spec.engine_config.model_copy(update={"max_context_len": 512})}
    )
    engine = SGLangEngine(spec, "judge/0", engine_cls=FakeSGLangEngine)
    await engine.start()
    try:
        outs = await engine.generate(_grouped(groups=3, per_group=4, shared=120, own=20))
        assert len(outs) == 12
        # one warm-up per group, then each member found the group's 120 tokens cached
        assert engine.counters["prefix_warmups"] == 3
        assert engine.counters["cached_prompt_tokens"] >= 12 * 120
        # prompts that share nothing (or too little) are sent as they are
        before = engine.counters["prefix_warmups"]
        await engine.generate([_req(40, first=10 + 3 * i) for i in range(4)])
        assert engine.counters["prefix_warmups"] == before
    finally:
        await engine.shutdown()


async def test_without_the_warm_up_every_member_recomputes_its_group_s_run(
    grouped_engine: Started,
) -> None:
    """Why the warm-up exists: the same engine with no run long enough to warm up (a policy
    whose minimum no run reaches) sends a group's members together, and SGLang, which caches
    a prompt only once its request finished, gives none of them anything of the others."""
    engine, fake = grouped_engine
    engine.warmup_policy = WarmupPolicy(min_tokens=10_000)
    reqs = _grouped(groups=2, per_group=4, shared=120, own=20)
    gate = asyncio.Event()
    fake.gate = gate  # all in flight together, as a batch's members reach SGLang at once
    batch = asyncio.ensure_future(engine.generate(reqs))
    try:
        assert await _until(lambda: fake.in_flight == 8), f"in flight: {fake.in_flight}"
    finally:
        fake.loop.call_soon_threadsafe(gate.set)
    outs = await asyncio.wait_for(batch, 20)
    assert len(outs) == 8 and engine.counters["prefix_warmups"] == 0
    assert engine.counters["cached_prompt_tokens"] == 0


@pytest.fixture
async def grouped_engine(tiny_dir: Path) -> AsyncIterator[Started]:
    """A started engine over the fake with room for ``_grouped`` prompts (512 tokens)."""
    spec = _spec(tiny_dir)
    config = spec.engine_config.model_copy(update={"max_context_len": 512})
    engine = SGLangEngine(
        spec.model_copy(update={"engine_config": config}), "judge/0", engine_cls=FakeSGLangEngine
    )
    await engine.start()
    yield engine, engine.sgl
    await engine.shutdown()


def _heads(reqs: list[EngineRequest], per_group: int, shared: int) -> list[list[int]]:
    """Each group's shared run (its warm-up's prompt), group by group."""
    return [list(reqs[g].prompt_token_ids or [])[:shared] for g in range(0, len(reqs), per_group)]


def _at(fake: FakeSGLangEngine, kind: str, prompt: list[int]) -> int | None:
    """Where in the fake's events ``prompt`` first did ``kind`` (``None``: not yet)."""
    events = list(fake.events)
    return next((n for n, (k, p) in enumerate(events) if k == kind and p == prompt), None)


def _arrived(fake: FakeSGLangEngine, head: list[int]) -> int:
    """How many prompts longer than ``head`` that start with it reached the fake."""
    return sum(
        k == "arrive" and len(p) > len(head) and p[: len(head)] == head
        for k, p in list(fake.events)
    )


async def _until(cond: Any, timeout_s: float = 10.0) -> bool:
    for _ in range(int(timeout_s / 0.02)):
        if cond():
            return True
        await asyncio.sleep(0.02)
    return bool(cond())


async def test_a_group_s_members_go_out_when_its_own_warm_up_finished(
    grouped_engine: Started,
) -> None:
    """Not after every group's warm-up: group 1's warm-up held, group 0 is served meanwhile."""
    engine, fake = grouped_engine
    reqs = _grouped(groups=2, per_group=4, shared=120, own=20)
    heads = _heads(reqs, 4, 120)
    release = asyncio.Event()
    fake.holds = [(heads[1], release)]
    batch = asyncio.ensure_future(engine.generate(reqs))
    try:
        served = await _until(lambda: sum(k == "finish" for k, _ in list(fake.events)) >= 5)
        assert served, "group 0's members never went out while group 1's warm-up was in flight"
        assert _at(fake, "finish", heads[1]) is None and _arrived(fake, heads[1]) == 0
    finally:
        fake.loop.call_soon_threadsafe(release.set)
    outs = await asyncio.wait_for(batch, 20)
    assert len(outs) == 8 and engine.counters["prefix_warmups"] == 2
    # every member found its group's run in the cache (no member can find more than it)
    assert engine.counters["cached_prompt_tokens"] == 8 * 120


async def test_warm_ups_go_out_in_waves(grouped_engine: Started) -> None:
    """Two runs of 120 a wave: the second wave's warm-ups reach SGLang only after the first
    wave's finished (beside the first groups' members), and every member still finds its run
    in the cache."""
    engine, fake = grouped_engine
    engine.warmup_policy = WarmupPolicy(wave_tokens=250)
    reqs = _grouped(groups=4, per_group=4, shared=120, own=20)
    heads = _heads(reqs, 4, 120)
    outs = await asyncio.wait_for(engine.generate(reqs), 20)
    assert len(outs) == 16
    finished = [_at(fake, "finish", h) for h in heads[:2]]
    arrived = [_at(fake, "arrive", h) for h in heads[2:]]
    assert None not in finished and None not in arrived
    assert min(a for a in arrived if a is not None) > max(f for f in finished if f is not None)
    assert engine.counters["prefix_warmups"] == 4
    assert engine.counters["prefix_warm_tokens"] == 4 * 120
    assert engine.counters["cached_prompt_tokens"] == 16 * 120  # each member: its run, no more
    # and each says so in its own output (the service puts it in the reply's meta)
    assert [o.extra["cached_prompt_tokens"] for o in outs] == [120] * 16


async def test_a_rollout_s_samples_go_out_at_once_and_a_judge_s_are_warmed(
    grouped_engine: Started,
) -> None:
    """A rollout group: 4 samples of one 140-token prompt, each to generate 200 tokens (more
    than its prompt). They reach SGLang at once, with no warm-up ahead of them. The same
    prompts with one-token replies (a judge's) wait for their group's warm-up."""
    engine, _ = grouped_engine
    rollout = _grouped(groups=1, per_group=4, shared=140, own=0)
    for r in rollout:
        r.sampling = r.sampling.model_copy(update={"max_response_len": 200})
    outs = await asyncio.wait_for(engine.generate(rollout), 20)
    assert len(outs) == 4 and engine.counters["prefix_warmups"] == 0
    assert engine.counters["prefix_warm_tokens"] == 0
    judge = _grouped(groups=1, per_group=4, shared=140, own=0)
    for r in judge:
        r.prompt_token_ids = [21, *list(r.prompt_token_ids or [])[1:]]  # a new prompt: uncached
    await asyncio.wait_for(engine.generate(judge), 20)
    assert engine.counters["prefix_warmups"] == 1


async def test_a_failed_warm_up_still_lets_its_members_through(grouped_engine: Started) -> None:
    engine, fake = grouped_engine
    reqs = _grouped(groups=2, per_group=4, shared=120, own=20)
    heads = _heads(reqs, 4, 120)
    for r in reqs:  # greedy: the same tokens on every run
        r.sampling = r.sampling.model_copy(update={"temperature": 0.0})
    fake.refuse = [heads[0]]
    outs = await asyncio.wait_for(engine.generate(reqs), 20)
    assert engine.counters["prefix_warmups"] == 1  # group 1's; group 0's was refused
    assert engine.counters["prefix_warm_tokens"] == 2 * 120
    assert _arrived(fake, heads[0]) == 4
    fake.refuse = []
    again = await asyncio.wait_for(engine.generate(reqs), 20)  # every run cached by now
    assert [o.token_ids for o in outs] == [o.token_ids for o in again]
    assert [o.prompt_tokens for o in outs] == [140] * 8


async def test_cancelling_a_batch_mid_way_leaves_nothing_in_flight(
    grouped_engine: Started,
) -> None:
    """Cancelled with group 1's warm-up and group 0's members in flight: both are cancelled
    at SGLang, group 1's members are never sent, and the engine serves the next batch."""
    engine, fake = grouped_engine
    reqs = _grouped(groups=2, per_group=4, shared=120, own=20)
    heads = _heads(reqs, 4, 120)
    release = asyncio.Event()
    fake.holds = [(heads[1], release)] + [
        (list(r.prompt_token_ids or []), release) for r in reqs[:4]
    ]
    batch = asyncio.ensure_future(engine.generate(reqs))
    try:
        assert await _until(lambda: fake.in_flight == 5), f"in flight: {fake.in_flight}"
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch
        assert await _until(lambda: fake.in_flight == 0 and not engine._pending)
        await asyncio.sleep(0.2)
        assert _arrived(fake, heads[1]) == 0
    finally:
        fake.loop.call_soon_threadsafe(release.set)
    outs = await asyncio.wait_for(engine.generate(reqs[:2]), 20)
    assert len(outs) == 2


# -- 20. a logprob verdict in one pass: P("1") from the first reply token's log-probs ------------
async def test_logprob_verdict_in_one_pass(start: Any) -> None:
    import math

    from genrm_client.types import Message

    engine, fake = await start()
    off = {"enable_thinking": False}
    reqs = [
        EngineRequest(
            sampling=SamplingParams(
                max_response_len=1,
                temperature=0.0,
                logprob_verdict=True,
                chat_template_kwargs=off,
            ).merged_over(DEFAULT_SAMPLING),
            messages=[Message(role="user", content=f"Is {i} + {i} = {2 * i}? Reply 1 or 0.")],
        )
        for i in range(3)
    ]
    n_calls = fake.calls.count("async_generate")
    outs = await engine.generate(reqs)
    assert fake.calls.count("async_generate") - n_calls == 3  # one pass each, no sampling
    assert engine.prompts is not None
    for out, req in zip(outs, reqs, strict=True):
        favour = sum(engine.prompts.encode(req)) % 2 == 0  # the fake's rule
        lp_one, lp_zero = (-0.1, -2.5) if favour else (-2.5, -0.1)
        expected = math.exp(lp_one) / (math.exp(lp_one) + math.exp(lp_zero))
        assert out.extra["verdict_prob"] == pytest.approx(expected, abs=1e-9)


# -- samples of a group arriving one by one follow the one computing their run ----------------
def _keyed(reqs: list[EngineRequest], per_group: int) -> list[EngineRequest]:
    """Each request's ``prefix_key``: its group, as the rewards set it."""
    for i, r in enumerate(reqs):
        r.prefix_key = f"group-{i // per_group}"
    return reqs


@contextlib.asynccontextmanager
async def _held(started: Started, req: EngineRequest) -> AsyncIterator[None]:
    """``req`` sent alone and held in SGLang (arrived, not finished) for the block: a leader
    still computing its group's run. Released, and its answer awaited, after."""
    engine, fake = started
    prompt = list(req.prompt_token_ids or [])
    release = asyncio.Event()
    fake.holds = [(prompt, release)]
    leader = asyncio.ensure_future(engine.generate([req]))
    try:
        assert await _until(lambda: _at(fake, "arrive", prompt) is not None)
        yield
    finally:
        fake.loop.call_soon_threadsafe(release.set)
    await asyncio.wait_for(leader, 10)


async def test_a_sample_arriving_while_its_group_s_run_is_computed_follows_it(
    grouped_engine: Started,
) -> None:
    """Inline scoring: a group's samples reach the engine as batches of one. The second, sent
    while the first is still being computed, reaches SGLang only after the first finished, and
    takes the group's run from the cache; another group's sample is not held."""
    engine, fake = grouped_engine
    reqs = _keyed(_grouped(groups=2, per_group=2, shared=120, own=20), 2)
    async with _held(grouped_engine, reqs[0]):
        second = asyncio.ensure_future(engine.generate([reqs[1]]))
        other = await asyncio.wait_for(engine.generate([reqs[2]]), 10)  # group 1: not held
        assert other[0].completion_tokens == 1
        await asyncio.sleep(0.1)
        assert _at(fake, "arrive", list(reqs[1].prompt_token_ids or [])) is None
        assert engine.counters["followed"] == 1
    (out,) = await asyncio.wait_for(second, 10)
    assert out.completion_tokens == 1
    # the leader and group 1's sample computed everything; the follower read the run (120)
    assert engine.counters["cached_prompt_tokens"] == 120


async def test_a_follower_waits_no_longer_than_the_follow_limit(
    grouped_engine: Started, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader still running (a thinking judge decoding) holds its followers at most
    ``limits.SGLANG_FOLLOW_WAIT_S``: SGLang caches a running request's prompt, so they go out
    then."""
    monkeypatch.setattr(limits, "SGLANG_FOLLOW_WAIT_S", 0.2)
    engine, _fake = grouped_engine
    reqs = _keyed(_grouped(groups=1, per_group=2, shared=120, own=20), 2)
    async with _held(grouped_engine, reqs[0]):
        (out,) = await asyncio.wait_for(engine.generate([reqs[1]]), 5)  # not behind the leader
        assert out.completion_tokens == 1 and engine.counters["followed"] == 1


async def test_requests_without_a_key_or_of_a_finished_leader_go_out_at_once(
    grouped_engine: Started,
) -> None:
    engine, _fake = grouped_engine
    reqs = _grouped(groups=1, per_group=3, shared=120, own=20)
    async with _held(grouped_engine, reqs[0]):
        await asyncio.wait_for(engine.generate([reqs[1]]), 5)  # no prefix_key: never held
    keyed = _keyed(_grouped(groups=1, per_group=2, shared=120, own=20), 2)
    await engine.generate([keyed[0]])
    await asyncio.wait_for(engine.generate([keyed[1]]), 5)  # its leader is done: no wait
    assert engine.counters["followed"] == 0
