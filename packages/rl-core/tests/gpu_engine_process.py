"""An hf rollout engine in a process of its own, driven through two queues (GPU weight-sync tests).

It lives in a module of its own so that a ``spawn``-ed child can import it (test modules are
imported by path, not by name). Messages are ``(verb, payload)``; every one gets one reply.
"""

from __future__ import annotations

import asyncio
from typing import Any


def engine_process(model_path: str, device_index: int, inbox: Any, outbox: Any) -> None:
    """Serve ``model_path`` on the parent's ``cuda:device_index`` until ``("stop", None)``.

    The GPU is chosen with ``CUDA_VISIBLE_DEVICES`` before CUDA starts, not ``set_device``: the
    engine loads and computes in worker threads, and a thread starts on device 0.
    """
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(device_index + 1)]
    os.environ["CUDA_VISIBLE_DEVICES"] = ids[device_index]

    import torch

    from genrm_client.types import SamplingParams
    from genrm_serve.config import DEFAULT_SAMPLING, EngineConfig, InstanceSpec
    from genrm_serve.engines.base import EngineRequest
    from genrm_serve.engines.hf import HFEngine

    async def serve() -> None:
        spec = InstanceSpec(
            route_key="rollout",
            model_path=model_path,
            num_gpus=1,
            engine="hf",
            engine_config=EngineConfig(device="cuda", max_context_len=512),
        )
        engine = HFEngine(spec, "rollout/0")
        await engine.start()
        outbox.put(("ready", engine.weight_version))
        while True:
            verb, payload = inbox.get()
            try:
                if verb == "ipc":
                    buckets, version, done = payload
                    await engine.update_weights_from_ipc(buckets, version, done)
                    reply: Any = engine.weight_version
                elif verb == "init_weight_group":
                    host, port, rank, world, backend = payload
                    await engine.init_weight_group(host, port, rank, world, backend)
                    reply = None
                elif verb == "broadcast":
                    buckets, version = payload
                    await engine.update_weights_from_broadcast(buckets, version)
                    reply = engine.weight_version
                elif verb == "version":
                    reply = engine.weight_version
                elif verb == "save_weights":  # payload: a file path
                    weights = {n: p.detach().cpu() for n, p in engine.model.named_parameters()}
                    torch.save(weights, payload)
                    reply = str(engine.dtype)
                elif verb == "generate":  # the weight version a rollout reports
                    sampling = SamplingParams(temperature=0.0, max_response_len=4).merged_over(
                        DEFAULT_SAMPLING
                    )
                    req = EngineRequest(
                        sampling=sampling, prompt_token_ids=payload, return_tokens=True
                    )
                    reply = (await engine.generate([req]))[0].weight_version
                else:
                    await engine.shutdown()
                    outbox.put(("ok", None))
                    return
            except Exception as err:  # the test sees the engine's own error
                outbox.put(("error", f"{type(err).__name__}: {err}"))
                continue
            outbox.put(("ok", reply))

    asyncio.run(serve())
