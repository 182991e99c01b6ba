"""The production GPU engine: SGLang's in-process ``sgl.Engine`` inside the engine's Ray actor.

SGLang pins its own torch and transformers, which clash with this workspace's lock, and needs
CUDA; so it is imported lazily, only when an ``sglang`` engine starts, and lives in a separate
environment (``engine_config.python_executable``, see the package README). Written against
SGLang's source (``python/sglang/srt``, main branch of 2026, 0.5.x API); where a behaviour below
names an SGLang file, that is the file it follows.

One job a module: ``launch.py`` (server arguments, GPUs and actor options, decided before
SGLang starts), ``prefix_warmup.py`` (which shared prompt runs are computed ahead, pure),
``process.py`` (the thread that owns ``sgl.Engine``, SIGQUIT, child processes, their stderr),
``weights.py`` (a trainer's weight buckets as SGLang's scheduler takes them) and ``engine.py``
(:class:`SGLangEngine`, which uses them all). One thread owns the engine and its event loop and
takes every request concurrently, so SGLang's continuous batching sees every request in flight,
of every batch the worker in front sends (``engines/worker.py`` runs a continuous engine's
batches concurrently); ``process.py`` says why a thread.

Behaviours taken from SGLang's source (each is a test in ``tests/test_engine_sglang*.py``):

- Sleep keeps a judge's weights: ``enable_weights_cpu_backup`` (without it,
  ``release_memory_occupation(["weights"])`` frees the pages and resume maps fresh, uninitialised
  ones: ``managers/scheduler_update_weights_mixin.py``; SGLang issues #6367, #19442).
- ``flush_cache`` answers ``success=False`` while requests are pending, and release asserts the
  scheduler is idle (it dies otherwise): the flush is retried until it succeeds, under
  ``limits.SGLANG_FLUSH_DEADLINE_S``.
- Sleep releases weights, KV cache and CUDA graphs (``cuda_graph`` tag; graphs are inside the
  memory saver only with ``SGLANG_MEMORY_SAVER_CUDA_GRAPH=true``,
  ``utils/torch_memory_saver_adapter.py``, as slime sets it).
- Context limits come from ``get_server_info()`` after start: SGLang refuses a prompt
  ``>= context_len`` and prompt + ``max_new_tokens > context_len`` with a ``ValueError``
  (``tokenizer_manager._validate_one_request``), and its scheduler aborts a prompt of
  ``max_req_input_len = max_req_len - 5`` tokens *or more* (``managers/utils.py:
  validate_input_length``; seen on 0.5.17). We refuse both per request as
  :class:`PromptTooLongError` (HTTP 413) and cap ``max_new_tokens``.
- Start-up: SGLang's defaults, except where our settings forbid one (``launch.py``: the
  breakable prefill CUDA graphs of 0.5.17 refuse the memory saver, so prefill graphs go off,
  logged), then ``engine_config.server_args`` as given, unknown keys refused before the model
  loads. A scheduler that dies while loading SIGQUITs this process: the guard is installed
  before SGLang starts, and the :class:`EngineError` carries the last lines SGLang's processes
  wrote to stderr (``process.py``, ``OutputTail``), where its traceback is.
- Weights from a trainer on the same GPU: its CUDA IPC buckets go to SGLang's scheduler
  unopened (``weights.py``). From a trainer on other GPUs: SGLang's schedulers join the
  trainer's weight-broadcast group, one rank per TP rank, and receive each flat bucket as one
  broadcast of its bytes (``weights.py``, and ``engines/weights.py`` ``WeightBroadcastGroup``).
- Any other per-request SGLang error stays with its request (:class:`EngineBatchError`).
- ``top_k <= 0`` is sent as -1 (SGLang raises on 0: ``sampling/sampling_params.py: verify``).
- A request's ``seed`` is SGLang's ``sampling_seed``, honoured only with
  ``enable_deterministic_inference`` (``engine_config.deterministic_inference``); without it a
  sampled (temperature > 0) request with a seed is refused, never silently unseeded.
- Multi-GPU engines: ``base_gpu_id`` / ``gpu_id_step`` from the GPUs Ray gave the actor, which
  sees every GPU of its node (``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1``, as slime does);
  ``nnodes`` / ``node_rank`` / ``dist_init_addr`` from an explicit :class:`SGLangPlacement`.
- A failing SGLang child sends SIGQUIT to its parent (``scheduler.py: run_scheduler_process``;
  a hung forward does too, ``utils/watchdog.py: ProcessWatchdog``; and SGLang's
  ``SubprocessWatchdog`` SIGQUITs this process when a child dies), whose default action kills the
  actor silently; SGLang installs its own handler only on the main thread. We install one (main
  thread: marks the engine failed; elsewhere, e.g. a Ray async actor where ``signal.signal``
  refuses, SIGQUIT is ignored) and watch the children: a dead one marks the engine failed and
  fails its requests with the exit code; a hung one fails the health probe.
- ``mem_fraction_static`` is passed as given; ``create_engine_worker(..., shared_gpu=True)``
  refuses an SGLang engine without it (the layout's owner says whether GPUs are shared).
- ``configure_logger`` calls ``logging.basicConfig(force=True)`` (``utils``): the root
  logger's handlers and level are put back after start.
- Health probes a one-token generation under ``limits.SGLANG_PROBE_TIMEOUT_S`` (a hung scheduler is
  unhealthy), unless an output arrived within that window (SGLang's ``/health_generate`` does the
  same).
"""

from genrm_serve.engines.sglang.engine import (
    MEMORY_TAGS,
    SGLangEngine,
    SGLangPromptTooLongError,
    sglang_sampling_params,
)
from genrm_serve.engines.sglang.launch import (
    ENGINE_ENV,
    SGLANG_INSTALL_HINT,
    SGLangPlacement,
    device_kwargs,
    engine_actor_options,
    import_sglang_engine,
    sglang_engine_kwargs,
)

__all__ = [
    "ENGINE_ENV",
    "MEMORY_TAGS",
    "SGLANG_INSTALL_HINT",
    "SGLangEngine",
    "SGLangPlacement",
    "SGLangPromptTooLongError",
    "device_kwargs",
    "engine_actor_options",
    "import_sglang_engine",
    "sglang_engine_kwargs",
    "sglang_sampling_params",
]
