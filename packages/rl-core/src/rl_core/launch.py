"""From flags to a running GRPO job: plan → Ray → judge service → engines → trainer → summary.

This is the only module that knows where things run. On a CPU machine everything is a real
process on local Ray: the judge service (genrm-serve on Ray Serve, real HTTP on loopback) with its
engine actors, the rollout engine actor(s) (genrm-serve's ``hf`` engine), and the trainer in the
driver. The placement plan decides the mode and the phase table (which engines sleep when); on
GPUs it is also realised as placement groups.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from rich.console import Console

from genrm_serve.ray_env import LOCAL_RAY_ENV, apply_ray_env_defaults
from rl_core.backends.base import BackendConfig
from rl_core.config import GENERATED_DATA, TrainConfig
from rl_core.data import PromptDataset, load_prompt_data, make_easy_math
from rl_core.engines import EngineHandle, RayEngineHandle
from rl_core.grpo.loss import LossConfig
from rl_core.metrics import MetricsWriter, PhaseClock
from rl_core.phases import (
    CallbackSleeper,
    GroupSleeper,
    PhaseMachine,
    Sleeper,
    default_phases,
    phases_from_plan,
)
from rl_core.rewards import PostProcessHook, custom_post_process, defer_swap_post_process
from rl_core.trainer import GRPOTrainer, RewardSetup

logger = logging.getLogger(__name__)

#: Set before Ray starts (unless the user set them): see ``genrm_serve.ray_env``.
RAY_ENV = LOCAL_RAY_ENV

#: Seeds of the demo's generated data sets (train and held-out evaluation differ).
EASY_MATH_TRAIN = (256, 11)
EASY_MATH_EVAL = (64, 977)


def resolve_model(path: str) -> str:
    """A local model folder: ``embedded[:name]`` becomes genrm-serve's cached safetensors copy
    of the embedded model (converted from GGUF once), anything else must be a model folder."""
    from genrm_serve.models import resolve_model_path

    return str(resolve_model_path(path))


def load_data(spec: str, cfg: TrainConfig, run_dir: Path, *, eval_set: bool) -> PromptDataset:
    """Read a jsonl file, or generate the demo set (written to RUN_DIR/data/ for inspection)."""
    if spec in GENERATED_DATA:
        n, seed = EASY_MATH_EVAL if spec.endswith("-eval") else EASY_MATH_TRAIN
        path = run_dir / "data" / f"{spec.removeprefix('gen:')}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as f:
            for r in make_easy_math(n, seed=seed):
                f.write(json.dumps({"prompt": r.prompt, "label": r.label, "metadata": r.metadata}))
                f.write("\n")
        spec = str(path)
    ds = load_prompt_data(
        spec,
        input_key=cfg.input_key,
        label_key=cfg.label_key,
        strict=cfg.strict_data,
    )
    if ds.skipped:
        first = ds.skipped[0]
        logger.warning(
            "%s: skipped %d bad record(s); first: line %d: %s",
            spec,
            len(ds.skipped),
            first.line,
            first.reason,
        )
    return ds


def backend_config(cfg: TrainConfig) -> BackendConfig:
    return BackendConfig(
        lr=cfg.lr,
        min_lr=cfg.min_lr,
        lr_decay_style=cfg.lr_decay_style,
        lr_warmup_iters=cfg.lr_warmup_iters,
        lr_decay_iters=cfg.lr_decay_iters,
        weight_decay=cfg.weight_decay,
        adam_beta1=cfg.adam_beta1,
        adam_beta2=cfg.adam_beta2,
        clip_grad=cfg.clip_grad,
        max_tokens_per_micro_batch=cfg.max_tokens_per_gpu,
        logprob_chunk_size=cfg.logprob_chunk_size,
        bf16=cfg.bf16,
        temperature=cfg.rollout_temperature,
        seed=cfg.seed,
        loss=LossConfig(
            eps_clip=cfg.eps_clip,
            eps_clip_high=cfg.eps_clip_high,
            use_kl_loss=cfg.use_kl_loss,
            kl_loss_coef=cfg.kl_loss_coef,
            kl_loss_type=cfg.kl_loss_type,
            use_tis=cfg.use_tis,
            tis_clip=cfg.tis_clip,
            tis_clip_low=cfg.tis_clip_low,
        ),
    )


def _prepare_run_dir(cfg: TrainConfig) -> Path:
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(cfg.model_dump_json(indent=1))
    return run_dir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HttpJudgeSleeper:
    """Sleep / wake one judge instance through the service's ``/sleep`` and ``/wake_up``."""

    def __init__(self, url: str, route_key: str, timeout_s: float = 600.0) -> None:
        self.url, self.route_key, self.timeout_s = url, route_key, timeout_s

    async def _post(self, path: str) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            r = await client.post(f"{self.url}/{path}", json={"route_key": self.route_key})
            r.raise_for_status()

    async def sleep(self) -> None:
        await self._post("sleep")

    async def wake(self) -> None:
        await self._post("wake_up")


def resolve_plan(ns: Any, cfg: TrainConfig) -> tuple[str, dict[str, dict[str, Any]], Any]:
    """The placement plan's mode and phase table (or the default table without ``--resource``)."""
    if cfg.resource is not None:
        from rl_core.placement import plan_from_args

        plan = plan_from_args(ns)
        return str(plan.mode), phases_from_plan(plan), plan
    mode = "fully-async" if cfg.fully_async else "colocate"
    if cfg.defer_reward_to_post_process:
        mode = "colocate-defer-swap"
    return mode, dict(default_phases(mode, list(cfg.genrm_instances))), None


def _reward_setup(cfg: TrainConfig) -> RewardSetup:
    from genrm_rewards.registry import load_custom, resolve_reward_fn

    if cfg.defer_reward_to_post_process:
        from genrm_rewards.defer import score_deferred

        hook: PostProcessHook = defer_swap_post_process
        if cfg.custom_reward_post_process_path:
            user_hook = load_custom(cfg.custom_reward_post_process_path)
            hook = custom_post_process(user_hook)
        return RewardSetup(
            args=cfg,
            reward_key=cfg.reward_key,
            inline_fn=None,
            batch_fn=score_deferred,
            post_process=hook,
            concurrency=cfg.reward_concurrency,
        )
    return RewardSetup(
        args=cfg,
        reward_key=cfg.reward_key,
        inline_fn=resolve_reward_fn(cfg),
        concurrency=cfg.reward_concurrency,
    )


async def _start_rollout_engines(cfg: TrainConfig, policy_path: str) -> list[EngineHandle]:
    from genrm_serve.config import EngineConfig, InstanceSpec
    from genrm_serve.engines.worker import create_engine_worker

    spec = InstanceSpec(
        route_key="rollout",
        model_path=policy_path,
        num_gpus=1,
        engine="hf",
        engine_config=EngineConfig(
            max_batch_size=max(cfg.n_samples_per_prompt, 1) * 4,
            max_context_len=(cfg.rollout_max_prompt_len or 4096) + cfg.rollout_max_response_len,
        ),
    )
    actor = create_engine_worker(spec, 0, num_cpus=0.5, num_gpus=None)
    await asyncio.wait_for(actor.start.remote(), 1800)
    return [RayEngineHandle(actor, "rollout-0")]


async def run_training(cfg: TrainConfig, ns: Any, console: Console | None = None) -> int:
    """Run the whole job from a config; returns the exit status."""
    apply_ray_env_defaults(disable_auth=True)
    import ray

    console = console or Console(stderr=True)
    t_start = time.perf_counter()
    startup: dict[str, float] = {}
    run_dir = await asyncio.to_thread(_prepare_run_dir, cfg)

    mode, table, plan = resolve_plan(ns, cfg)
    if plan is not None:
        from rl_core.placement import render_plan

        console.print(render_plan(plan))
    console.print(f"[bold]mode[/]: {mode}")

    async with AsyncExitStack() as stack:
        t0 = time.perf_counter()
        if not ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS") or "local"
            # Engine and Serve logs stay in Ray's session logs; the driver shows the phases.
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if address == "local":
                kwargs["num_cpus"] = max(2, os.cpu_count() or 2)
            ray.init(address=address, **kwargs)
            stack.callback(ray.shutdown)
        startup["ray"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        policy_path = await asyncio.to_thread(resolve_model, cfg.hf_checkpoint)
        startup["models"] = time.perf_counter() - t0

        participants: dict[str, Sleeper] = {}
        if cfg.genrm_enabled:
            t0 = time.perf_counter()
            from ray import serve

            from genrm_serve.app import build_app, deploy, wait_until_healthy
            from genrm_serve.serve_args import ServeArgs

            instances = dict(cfg.genrm_instances)  # engines resolve their model paths
            sargs = ServeArgs(port=_free_port(), engine_num_cpus=0.5)
            deploy(build_app(instances, args=sargs), sargs)
            stack.callback(serve.shutdown)
            await asyncio.to_thread(wait_until_healthy, sargs, 1800.0)
            os.environ["GENRM_URL"] = sargs.url
            # reward functions use genrm-client's process-wide client, which reads GENRM_URL
            # when it is created: drop any made before this service existed, and close ours last
            from genrm_client import close_genrm_clients

            await close_genrm_clients()
            stack.push_async_callback(close_genrm_clients)
            console.print(f"[bold]judge service[/]: {sargs.url} ({', '.join(instances)})")
            for key in instances:
                participants[f"genrm:{key}"] = HttpJudgeSleeper(sargs.url, key)
            startup["judge_service"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        engines = await _start_rollout_engines(cfg, policy_path)
        startup["rollout_engines"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        from transformers import AutoTokenizer

        from rl_core.backends.torch_hf import TorchHFBackend

        device = cfg.device
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, policy_path)
        backend = await asyncio.to_thread(
            TorchHFBackend, policy_path, backend_config(cfg), device=device
        )
        startup["trainer"] = time.perf_counter() - t0
        participants["rollout"] = GroupSleeper(engines)
        participants["actor"] = CallbackSleeper(backend.offload, backend.onload)

        train_data = load_data(cfg.prompt_data, cfg, run_dir, eval_set=False)
        eval_data = (
            load_data(cfg.eval_prompt_data, cfg, run_dir, eval_set=True)
            if cfg.eval_prompt_data
            else None
        )
        trainer = GRPOTrainer(
            cfg,
            backend=backend,
            tokenizer=tokenizer,
            rollout_engines=engines,
            phases=PhaseMachine(table, participants),
            rewards=_reward_setup(cfg),
            train_data=train_data,
            eval_data=eval_data,
            mode=mode,
            metrics=MetricsWriter(run_dir),
            clock=PhaseClock(console),
        )
        history = await trainer.run()

    from rl_core.plot import plot_run
    from rl_core.summary import render_summary

    figures = plot_run(run_dir)
    render_summary(
        history,
        mode=mode,
        startup=startup,
        total_s=time.perf_counter() - t_start,
        precision=getattr(backend, "precision", None),
        console=Console(),
    )
    Console().print("[bold]plots[/]: " + ", ".join(str(p) for p in figures))
    return 0
