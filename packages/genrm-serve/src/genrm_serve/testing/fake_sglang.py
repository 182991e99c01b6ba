"""``FakeSGLangEngine``: a stand-in for ``sglang.Engine`` (which needs a GPU) that models the
behaviours of SGLang's source the SGLang engine must handle.

A second SGLang, in miniature: each behaviour is marked ``SGLang:`` with the file and function it
follows (paths under ``python/sglang/srt``), so that the engine's tests
(``tests/test_engine_sglang*.py``) fail where the engine would fail on the real one. The engine's
own decisions that need no SGLang (launch arguments, warm-up plans) are tested without it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

__all__ = ["FakeFlushCacheReqOutput", "FakeSGLangEngine"]


def _fake_scheduler_process(failure: str | None = None) -> None:
    """The fake's stand-in for SGLang's scheduler child: sleeps until killed, or fails as
    SGLang's does (``scheduler.py run_scheduler_process``): prints the traceback to its stderr,
    sends SIGQUIT to its parent, exits 1."""
    import os
    import signal
    import sys
    import time

    if failure is not None:
        print("Traceback (most recent call last):", file=sys.stderr)
        print(
            '  File "sglang/srt/managers/scheduler.py", in run_scheduler_process', file=sys.stderr
        )
        print(failure, file=sys.stderr, flush=True)
        os.kill(os.getppid(), signal.SIGQUIT)
        sys.exit(1)
    time.sleep(3600)


class FakeFlushCacheReqOutput:
    """``managers/io_struct.py: FlushCacheReqOutput`` (``success``)."""

    def __init__(self, success: bool) -> None:
        self.success = success


class FakeSGLangEngine:
    """A *fake* of ``sglang.Engine`` (SGLang needs a GPU): the same constructor and methods, and
    the behaviours of SGLang's source that a caller must cope with. Each is marked ``SGLang:``
    with the file and function it follows (paths under ``python/sglang/srt``).

    Knobs for tests: ``visible_gpus`` (GPUs of the fake node), ``max_total_num_tokens`` (KV pool),
    ``gate`` (an ``asyncio.Event`` on the engine's loop that requests wait on, to hold them in
    flight), ``hang`` (requests never finish: a hung scheduler), :meth:`crash_scheduler`,
    ``holds`` (``(ids, event)`` pairs: a request whose prompt starts with ``ids`` waits on
    ``event``, to hold some requests in flight and not others), ``refuse`` (prompts that SGLang
    refuses as it refuses an invalid one: a ``ValueError`` for exactly that prompt).
    ``calls`` records every method called, in order; ``events`` every request's arrival and
    successful finish (``("arrive" | "finish", prompt)``, in order); ``max_in_flight`` the most
    requests that were in flight together.
    """

    #: ``ServerArgs`` fields the fake knows (``server_args.py``, 0.5.17): those we set, and the
    #: ones the tests pass through ``engine_config.server_args``. The engine checks a user's keys
    #: against this set as it checks them against the real ``ServerArgs``.
    SERVER_ARG_FIELDS = frozenset(
        {
            "model_path",
            "tokenizer_path",
            "tp_size",
            "pp_size",
            "dp_size",
            "ep_size",
            "context_length",
            "enable_memory_saver",
            "enable_weights_cpu_backup",
            "enable_dp_attention",
            "enable_deterministic_inference",
            "mem_fraction_static",
            "dtype",
            "random_seed",
            "log_level",
            "base_gpu_id",
            "gpu_id_step",
            "nnodes",
            "node_rank",
            "dist_init_addr",
            "attention_backend",
            "sampling_backend",
            "load_format",
            "chunked_prefill_size",
            "max_running_requests",
            "schedule_policy",
            "disable_radix_cache",
            "cuda_graph_config",
            "cuda_graph_backend_prefill",
            "cuda_graph_backend_decode",
            "cuda_graph_max_bs_decode",
            "disable_prefill_cuda_graph",
            "disable_cuda_graph",
        }
    )
    #: Set (tests) to make the scheduler fail while the model loads, with this exception text.
    fail_at_start: str | None = None
    visible_gpus = 8
    max_total_num_tokens = 1 << 20
    #: One scheduler step (seconds).
    step_s = 0.05

    def __init__(self, **server_args: Any) -> None:
        import asyncio
        import logging
        import multiprocessing
        import os

        # SGLang: server_args.py ServerArgs(**kwargs) rejects unknown fields.
        unknown = sorted(set(server_args) - self.SERVER_ARG_FIELDS)
        if unknown:
            raise TypeError(f"FakeSGLangEngine: unknown server argument(s) {unknown}")
        if "model_path" not in server_args:
            raise TypeError("FakeSGLangEngine: model_path is required")
        # SGLang: server_args.py -- log_level "info"; prefill CUDA graphs "breakable" on CUDA.
        args: dict[str, Any] = {"log_level": "info", "base_gpu_id": 0, "gpu_id_step": 1}
        args["cuda_graph_backend_prefill"] = "breakable"
        args.update(nnodes=1, node_rank=0, dist_init_addr=None, dp_size=1, pp_size=1)
        args.update(server_args)
        self.server_args = dict(server_args)
        self.resolved = args
        self.calls: list[str] = ["__init__"]
        #: weight-broadcast groups joined (init_weights_update_group), by group name
        self.weight_groups: dict[str, dict[str, Any]] = {}
        #: every update_weights_from_distributed request, with the broadcasts it would receive
        self.distributed_updates: list[dict[str, Any]] = []
        # SGLang: utils configure_logger (from engine.py _launch_subprocesses) --
        # logging.basicConfig(..., force=True) replaces the root logger's handlers.
        logging.basicConfig(level=getattr(logging, str(args["log_level"]).upper()), force=True)
        # SGLang: engine.py _launch_scheduler_processes -- one scheduler per local TP rank on
        # GPU base_gpu_id + (tp_rank % tp_per_node) * gpu_id_step; a bad id fails in CUDA.
        tp_per_node = int(args.get("tp_size", 1)) // int(args["nnodes"])
        self.devices = [
            int(args["base_gpu_id"]) + i * int(args["gpu_id_step"]) for i in range(tp_per_node)
        ]
        bad = [d for d in self.devices if not 0 <= d < self.visible_gpus]
        if bad:
            raise RuntimeError(f"CUDA error: invalid device ordinal {bad[0]}")
        # SGLang: engine.py _launch_subprocesses -- a node_rank >= 1 blocks until its
        # schedulers exit unless SGLANG_BLOCK_NONZERO_RANK_CHILDREN=0 (the fake refuses to hang).
        if (
            int(args["node_rank"]) >= 1
            and os.environ.get("SGLANG_BLOCK_NONZERO_RANK_CHILDREN") != "0"
        ):
            raise RuntimeError("FakeSGLangEngine: node_rank >= 1 would block here forever")
        # SGLang: scheduler.py -- max_req_len = min(context_len - 1, max_total_num_tokens - 1),
        # max_req_input_len = max_req_len - 5 (sent back as scheduler info).
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(args["model_path"]))
        # SGLang: tokenizer_manager.py -- input ids are checked against the model config's
        # vocab_size (a random Qwen3-shape model beside a small tokenizer takes ids up to 151,936)
        config = Path(str(args["model_path"])) / "config.json"
        self.vocab_size = len(self.tokenizer)
        if config.is_file():
            self.vocab_size = int(json.loads(config.read_text()).get("vocab_size", self.vocab_size))
        # SGLang: configs/model_config.py _derive_context_length (seen on 0.5.17) -- a
        # context_length over the model's own is a ValueError unless the env allows it.
        from transformers import AutoConfig

        derived = int(AutoConfig.from_pretrained(str(args["model_path"])).max_position_embeddings)
        asked = args.get("context_length")
        if (
            asked is not None
            and int(asked) > derived
            and os.environ.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN") != "1"
        ):
            raise ValueError(
                f"Warning: User-specified context_length ({asked}) is greater than the derived "
                f"context_length ({derived})."
            )
        self.context_len = int(asked or derived)
        self.max_req_input_len = min(self.context_len - 1, self.max_total_num_tokens - 1) - 5
        # SGLang: model_runner / torch_memory_saver_adapter -- CUDA graphs are captured inside
        # the memory saver's "cuda_graph" region only with SGLANG_MEMORY_SAVER_CUDA_GRAPH=true;
        # otherwise releasing that tag frees nothing.
        self.gpu_memory = {"weights": 100, "kv_cache": 300, "cuda_graph": 20}
        self.offload_tags: set[str] = set()
        self.weights_valid = True
        self.weight_names: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        #: prompts of finished requests (SGLang's radix cache; never evicted in the fake)
        self.radix: list[list[int]] = []
        self._running_until = 0.0
        self.gate: asyncio.Event | None = None
        self.holds: list[tuple[list[int], asyncio.Event]] = []
        self.refuse: list[list[int]] = []
        self.events: list[tuple[str, list[int]]] = []
        self.hang = False
        self.dead = False
        # SGLang: the scheduler is a child process (multiprocessing, spawn).
        self.graphs_releasable = os.environ.get("SGLANG_MEMORY_SAVER_CUDA_GRAPH") == "true"
        # SGLang: runner_backend/breakable_cuda_graph_backend.py (seen on 0.5.17) -- breakable
        # prefill graphs raise NotImplementedError with the memory saver when CUDA graphs are in
        # it; the scheduler dies of it while loading (run_scheduler_process: logs the traceback,
        # SIGQUITs its parent).
        failure = self.fail_at_start
        if (
            args.get("enable_memory_saver")
            and self.graphs_releasable
            and args["cuda_graph_backend_prefill"] == "breakable"
            and not args.get("disable_prefill_cuda_graph")
        ):
            failure = (
                "NotImplementedError: Breakable CUDA graph is not compatible with memory saver mode"
            )
        self.scheduler = multiprocessing.get_context("spawn").Process(
            target=_fake_scheduler_process,
            args=(failure,),
            name="fake-sglang-scheduler",
            daemon=True,
        )
        self.scheduler.start()
        if failure is not None:
            # SGLang: engine.py _wait_for_scheduler_ready / _scheduler_died_error.
            self.scheduler.join(30)
            raise RuntimeError(
                "Rank 0 scheduler died during initialization "
                f"(exit code: {self.scheduler.exitcode})."
            )
        # SGLang: engine.py Engine.__init__ -- adopt the running loop, else a new one.
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)

    @property
    def released(self) -> set[str]:
        return set(self.offload_tags)

    def gpu_bytes_in_use(self) -> int:
        held = 0
        for tag, size in self.gpu_memory.items():
            freed = tag in self.offload_tags and (tag != "cuda_graph" or self.graphs_releasable)
            held += 0 if freed else size
        return held

    def _fake_tokens(self, ids: list[int], n: int, salt: int = 0) -> list[int]:
        vocab = len(self.tokenizer)
        base = sum(ids) * 31 + salt * 977 + (0 if self.weights_valid else 12345)
        return [(base + 7 * i) % (vocab - 10) + 10 for i in range(n)]

    # -- generation --------------------------------------------------------------------------
    async def async_generate(
        self,
        prompt: object = None,
        sampling_params: dict[str, Any] | None = None,
        input_ids: list[int] | None = None,
        return_logprob: bool = False,
        token_ids_logprob: list[int] | None = None,
        top_logprobs_num: int | None = None,
        **_: object,
    ) -> dict[str, Any]:
        import asyncio
        import random

        from genrm_serve.engines.prefix_tree import common_prefix_len

        self.calls.append("async_generate")
        if input_ids is None or (input_ids and not isinstance(input_ids[0], int)):
            raise TypeError("FakeSGLangEngine: only single input_ids prompts are faked")
        if self.dead:
            raise RuntimeError("FakeSGLangEngine: the scheduler is dead")
        p = dict(sampling_params or {})
        self.events.append(("arrive", list(input_ids)))
        if list(input_ids) in self.refuse:  # a test's stand-in for any refused request
            raise ValueError(f"FakeSGLangEngine: refused prompt of {len(input_ids)} tokens")
        # SGLang: tokenizer_manager.py _validate_one_request.
        n_in = len(input_ids)
        if n_in >= self.context_len:
            raise ValueError(
                f"The input ({n_in} tokens) is longer than the model's context length "
                f"({self.context_len} tokens)."
            )
        vocab = self.vocab_size
        if input_ids and max(input_ids) >= vocab:
            raise ValueError(
                f"The input_ids {input_ids} contains values greater than the vocab size ({vocab})."
            )
        max_new = p.get("max_new_tokens", 128)
        if max_new is not None and max_new + n_in > self.context_len:
            raise ValueError(
                "Requested token count exceeds the model's maximum context length of "
                f"{self.context_len} tokens."
            )
        # SGLang: sampling/sampling_params.py SamplingParams.__post_init__ and verify.
        temperature = p.get("temperature", 1.0)
        top_k = p.get("top_k", -1)
        greedy = 0 <= temperature < 1e-6
        if not greedy and top_k != -1 and top_k < 1:
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
        if "sampling_seed" in p and p["sampling_seed"] is not None and "seed" in p:
            raise ValueError("unknown sampling parameter")
        # SGLang: mem_cache/radix_cache.py -- a prompt reuses the KV of finished requests only:
        # requests that arrive together are prefilled side by side, none cached for the others.
        cached = max((common_prefix_len(list(input_ids), r) for r in self.radix), default=0)
        cached = min(cached, n_in - 1)  # the last prompt token is always computed
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.offload_tags:
                # SGLang: a request while memory is released reads freed pages (or hangs).
                raise RuntimeError("FakeSGLangEngine: generate while memory is released")
            if self.gate is not None:
                await self.gate.wait()
            for ids, event in list(self.holds):
                if input_ids[: len(ids)] == ids:
                    await event.wait()
            if self.hang:
                await asyncio.Event().wait()  # never set: a hung scheduler
            await asyncio.sleep(0)
            # SGLang: managers/utils.py validate_input_length -- a prompt of max_req_input_len
            # tokens or more is aborted (seen on 0.5.17: 250 refused at 250).
            if n_in >= self.max_req_input_len:
                return {
                    "text": "",
                    "output_ids": [],
                    "meta_info": {
                        "prompt_tokens": n_in,
                        "completion_tokens": 0,
                        "finish_reason": {
                            "type": "abort",
                            "message": f"Input length ({n_in} tokens) exceeds the maximum "
                            f"allowed length ({self.max_req_input_len} tokens).",
                        },
                    },
                }
            # SGLang: layers/sampler.py -- sampling_seed is used only with
            # enable_deterministic_inference; otherwise a sampled token is random.
            if greedy:
                salt = 0
            elif (
                self.resolved.get("enable_deterministic_inference")
                and p.get("sampling_seed") is not None
            ):
                salt = int(p["sampling_seed"]) + 1
            else:
                salt = random.randrange(1, 1 << 30)
            n = min(int(max_new if max_new is not None else 128), 4)
            toks = self._fake_tokens(list(input_ids), n, salt)
            meta: dict[str, Any] = {
                "prompt_tokens": n_in,
                "completion_tokens": n,
                "cached_tokens": cached,
                "finish_reason": {"type": "length"} if n == max_new else {"type": "stop"},
            }
            self.radix.append(list(input_ids))
            self.events.append(("finish", list(input_ids)))
            if return_logprob:
                meta["output_token_logprobs"] = [
                    (-0.25 * (i + 1), t, None) for i, t in enumerate(toks)
                ]
                if top_logprobs_num:
                    # SGLang: tokenizer_manager.py -- per output position, the top
                    # ``top_logprobs_num`` (logprob, id, text), the greedy token first
                    meta["output_top_logprobs"] = [
                        [(-0.25 * (i + 1) - k, t + k, None) for k in range(top_logprobs_num)]
                        for i, t in enumerate(toks)
                    ]
                if token_ids_logprob:
                    # SGLang: tokenizer_manager.py -- per output position, (logprob, id, text)
                    # of each asked id; the fake's "model" favours the first id on even sums.
                    favour = sum(input_ids) % 2 == 0
                    meta["output_token_ids_logprobs"] = [
                        [
                            (-0.1 if (k == 0) == favour else -2.5, int(t), None)
                            for k, t in enumerate(token_ids_logprob)
                        ]
                    ]
            return {
                "text": self.tokenizer.decode(toks, skip_special_tokens=True),
                "output_ids": toks,
                "meta_info": meta,
            }
        finally:
            self.in_flight -= 1
            # SGLang: scheduler.py event loop -- a finished request leaves running_batch only at
            # the next scheduler step (filter_batch), after its output was already sent.
            self._running_until = time.monotonic() + self.step_s

    def busy(self) -> bool:
        """Requests in flight, or finished ones still in the running batch."""
        return self.in_flight > 0 or time.monotonic() < self._running_until

    def _run(self, coro: Any) -> Any:
        # SGLang: engine.py -- every sync method is self.loop.run_until_complete(...), which
        # raises "This event loop is already running" inside a running loop.
        return self.loop.run_until_complete(coro)

    def generate(
        self,
        prompt: object = None,
        sampling_params: Any = None,
        input_ids: Any = None,
        return_logprob: bool = False,
        top_logprobs_num: int | None = None,
        **_: object,
    ) -> Any:
        """SGLang: engine.py generate -- a batch is one ``GenerateReqInput``; one invalid request
        (``_validate_one_request`` raising) fails the whole call."""
        import asyncio

        self.calls.append("generate")
        if input_ids and isinstance(input_ids[0], int):
            return self._run(
                self.async_generate(
                    input_ids=input_ids,
                    sampling_params=sampling_params,
                    return_logprob=return_logprob,
                    top_logprobs_num=top_logprobs_num,
                )
            )
        rows = list(input_ids or [])
        params = (
            sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(rows)
        )

        async def batch() -> list[Any]:
            return list(
                await asyncio.gather(
                    *(
                        self.async_generate(
                            input_ids=r,
                            sampling_params=p,
                            return_logprob=return_logprob,
                            top_logprobs_num=top_logprobs_num,
                        )
                        for r, p in zip(rows, params, strict=True)
                    )
                )
            )

        return self._run(batch())

    def get_server_info(self) -> dict[str, Any]:
        """SGLang: engine.py get_server_info -- server args plus the scheduler's info."""
        self.calls.append("get_server_info")
        return {
            **self.resolved,
            "max_req_input_len": self.max_req_input_len,
            "max_total_num_tokens": self.max_total_num_tokens,
            "version": "fake",
        }

    # -- memory ------------------------------------------------------------------------------
    def flush_cache(self) -> FakeFlushCacheReqOutput:
        """SGLang: scheduler.py flush_cache -- fails (success=False) while requests are pending."""
        self.calls.append("flush_cache")

        async def flush() -> FakeFlushCacheReqOutput:
            return FakeFlushCacheReqOutput(not self.busy())

        result: FakeFlushCacheReqOutput = self._run(flush())
        return result

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """SGLang: scheduler_update_weights_mixin.py release_memory_occupation."""
        self.calls.append("release_memory_occupation")
        if self.busy():
            # assert self._is_no_request(): the scheduler process dies of it.
            self._die()
            raise AssertionError(
                "release_memory_occupation should be called only when no ongoing request."
            )
        if not self.resolved.get("enable_memory_saver"):
            return  # the memory saver is a no-op: nothing is released
        for tag in tags or ["weights", "kv_cache", "cuda_graph"]:
            self.offload_tags.add(tag)

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        """SGLang: resume_memory_occupation -- offload_tags.remove(tag) (KeyError if not held);
        weights come back only with enable_weights_cpu_backup (else fresh, garbage pages)."""
        self.calls.append("resume_memory_occupation")
        for tag in tags or ["weights", "kv_cache", "cuda_graph"]:
            self.offload_tags.remove(tag)
            if tag == "weights" and not self.resolved.get("enable_weights_cpu_backup"):
                self.weights_valid = False

    def update_weights_from_tensor(
        self,
        named_tensors: list[tuple[str, object]],
        load_format: str | None = None,
        flush_cache: bool = True,
    ) -> tuple[bool, str]:
        self.calls.append("update_weights_from_tensor")
        if "weights" in self.offload_tags:
            raise RuntimeError("FakeSGLangEngine: weight update while weights are released")
        self.weight_names = [name for name, _ in named_tensors]
        self.weights_valid = True
        return True, "Succeeded to update parameter online."

    def update_weights_from_disk(
        self, model_path: str, load_format: str | None = None
    ) -> tuple[bool, str]:
        self.calls.append("update_weights_from_disk")
        if "weights" in self.offload_tags:
            raise RuntimeError("FakeSGLangEngine: weight update while weights are released")
        self.weights_valid = True
        return True, "Succeeded to update model weights."

    # -- weights across GPUs ------------------------------------------------------------------
    def _check_dp_for_weight_group(self, what: str) -> None:
        # SGLang: managers/tokenizer_control_mixin.py -- asserts dp_size == 1 or DP attention.
        if int(self.resolved.get("dp_size", 1)) != 1 and not self.resolved.get(
            "enable_dp_attention"
        ):
            raise AssertionError(f"dp_size must be 1 or dp attention must be enabled for {what}")

    def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str = "nccl",
    ) -> tuple[bool, str]:
        """Records the group (no NCCL here): ``weight_groups[group_name]`` with the rank each TP
        rank takes, so tests check the ranks an engine claims."""
        self.calls.append("init_weights_update_group")
        self._check_dp_for_weight_group("update weights from distributed")
        # SGLang: model_runner_components/weight_updater.py init_weights_update_group --
        # asserts a non-empty group name; each TP rank joins as rank_offset + tp_rank.
        if group_name == "":
            raise AssertionError("Group name cannot be empty")
        tp = int(self.resolved.get("tp_size", 1))
        ranks = [rank_offset + r for r in range(tp)]
        # SGLang: same function -- torch's group creation raises for a rank outside the world;
        # the exception becomes (False, "Failed to initialize custom process group: ...").
        if min(ranks) < 0 or max(ranks) >= world_size:
            return False, (
                f"Failed to initialize custom process group: rank {max(ranks)} is not in a "
                f"world of {world_size}."
            )
        self.weight_groups[group_name] = {
            "address": (master_address, master_port),
            "ranks": ranks,
            "world_size": world_size,
            "backend": backend,
        }
        return True, "Succeeded to initialize custom process group."

    def destroy_weights_update_group(self, group_name: str) -> tuple[bool, str]:
        """SGLang: weight_updater.py destroy_weights_update_group -- (False, ...) if unknown."""
        self.calls.append("destroy_weights_update_group")
        if self.weight_groups.pop(group_name, None) is None:
            return False, "The group to be destroyed does not exist."
        return True, "Succeeded to destroy custom process group."

    def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str = "weight_update_group",
        flush_cache: bool = True,
        load_format: str | None = None,
    ) -> tuple[bool, str]:
        """Records the request and the broadcasts SGLang's receiver would post for it
        (``received``: ``(dtype, numel)`` per broadcast, in order), not the transfer."""
        import torch

        self.calls.append("update_weights_from_distributed")
        self._check_dp_for_weight_group("update weights from distributed")
        if "weights" in self.offload_tags:
            raise RuntimeError("FakeSGLangEngine: weight update while weights are released")
        # SGLang: weight_updater.py update_weights_from_distributed -- asserts the group exists
        # (outside its try: the scheduler dies of it, as the fake's caller sees an error).
        if group_name not in self.weight_groups:
            raise AssertionError(
                f"Group {group_name} not in {list(self.weight_groups)}. "
                "Please call `init_weights_update_group` first."
            )
        # SGLang: same function -- names, dtypes and shapes are zipped (the shortest wins); a
        # dtype string that is not a torch dtype fails inside the try: (False, message).
        posted: list[tuple[str, int]] = []
        for dtype, shape in zip(dtypes, shapes, strict=False):
            target = getattr(torch, dtype, None)
            if not isinstance(target, torch.dtype):
                return False, (
                    f"Failed to update parameter online: module 'torch' has no attribute "
                    f"'{dtype}'. The full weights of the ModelRunner are partially updated. "
                    "Please discard the whole weights."
                )
            numel = 1
            for d in shape:
                numel *= int(d)
            posted.append((dtype, numel * target.itemsize))
        # SGLang: same function -- "flattened_bucket" receives the tensors' concatenated bytes
        # in one uint8 broadcast (_update_bucketed_weights_from_distributed, tensor_bucket.py);
        # any other load format one broadcast per tensor, in its own dtype.
        if load_format == "flattened_bucket":
            received = [("uint8", sum(nbytes for _, nbytes in posted))]
        else:
            received = [
                (dtype, nbytes // getattr(torch, dtype).itemsize) for dtype, nbytes in posted
            ]
        self.distributed_updates.append(
            {
                "names": list(names),
                "dtypes": list(dtypes),
                "shapes": [list(s) for s in shapes],
                "group_name": group_name,
                "flush_cache": flush_cache,
                "load_format": load_format,
                "received": received,
            }
        )
        self.weight_names = list(names)
        self.weights_valid = True
        # SGLang: scheduler_components/weight_updater.py -- the cache is flushed after a
        # successful update when the request asks for it.
        return True, "Succeeded to update parameter online."

    # -- failure -----------------------------------------------------------------------------
    def _die(self) -> None:
        self.dead = True
        if self.scheduler.is_alive():
            self.scheduler.kill()
            self.scheduler.join(5)

    def crash_scheduler(self) -> None:
        """SGLang: scheduler.py run_scheduler_process -- on an exception the scheduler logs it,
        sends SIGQUIT to its parent (this process) and exits."""
        import os
        import signal

        self._die()
        os.kill(os.getpid(), signal.SIGQUIT)

    def shutdown(self) -> None:
        """SGLang: entrypoints/engine.py shutdown -- ends with ``kill_process_tree(os.getpid(),
        include_parent=False)`` (seen on 0.5.17): every child of the host process dies, another
        engine's scheduler too. The fake kills every ``multiprocessing`` child (where engines'
        schedulers live) and spares the test process's others (a local Ray's)."""
        import multiprocessing

        self.calls.append("shutdown")
        self._die()
        for child in multiprocessing.active_children():
            child.kill()
            child.join(5)
