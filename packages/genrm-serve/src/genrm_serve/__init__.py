"""GenRM judge service: LLM judges on Ray Serve with route_key routing.

This module is the package's public surface: what other packages (rl-core, users' launchers)
may import. Names resolve lazily, so ``import genrm_serve`` loads neither Ray nor torch; the
submodules behind them are internals and may change. A renamed name stays here as an alias of
its new one (:data:`_ALIASES`), so that users' code keeps working.
"""

from __future__ import annotations

import importlib
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

__version__ = _version("genrm-serve")

#: public name → the module that owns it
_EXPORTS: dict[str, str] = {
    # configuration
    "EngineConfig": "genrm_serve.config",
    "GenRMConfigError": "genrm_serve.config",
    "InstanceSpec": "genrm_serve.config",
    "add_genrm_args": "genrm_serve.config",
    "instances_from_args": "genrm_serve.config",
    "invalid_json": "genrm_serve.config",
    "ServeArgs": "genrm_serve.serve_args",
    "CapacityError": "genrm_serve.capacity",
    "check_fits": "genrm_serve.capacity",
    "check_service_fits": "genrm_serve.capacity",
    "cluster_capacity": "genrm_serve.capacity",
    "ENGINE_START_TIMEOUT_S": "genrm_serve.limits",
    "WEIGHT_GROUP_TIMEOUT_S": "genrm_serve.limits",
    # the service
    "build_app": "genrm_serve.app",
    "deploy": "genrm_serve.app",
    "EngineStartError": "genrm_serve.app",
    "ServeRunningError": "genrm_serve.app",
    "refuse_another_serve": "genrm_serve.app",
    "serve_namespace": "genrm_serve.app",
    "shutdown_serve": "genrm_serve.app",
    "start_proxy": "genrm_serve.app",
    "wait_until_healthy": "genrm_serve.app",
    "EnginePlacement": "genrm_serve.engine_refs",
    "EngineRef": "genrm_serve.engine_refs",
    # engines
    "Engine": "genrm_serve.engines.base",
    "EngineAsleepError": "genrm_serve.engines.base",
    "EngineError": "genrm_serve.engines.base",
    "EngineFailedError": "genrm_serve.engines.base",
    "EngineOutput": "genrm_serve.engines.base",
    "EngineRequest": "genrm_serve.engines.base",
    "engine_id_for": "genrm_serve.engines.base",
    "EngineGoneError": "genrm_serve.engines.remote",
    "RemoteEngine": "genrm_serve.engines.remote",
    "EngineWorker": "genrm_serve.engines.worker",
    "create_engine_worker": "genrm_serve.engines.worker",
    "check_owned_server_args": "genrm_serve.engines.sglang.launch",
    # moving weights: host buffers, buckets, CUDA IPC, a broadcast group
    "DEFAULT_BUCKET_BYTES": "genrm_serve.engines.weights",
    "BucketMeta": "genrm_serve.engines.weights",
    "dtype_from_name": "genrm_serve.engines.weights",
    "HostOffloader": "genrm_serve.engines.weights",
    "WeightBroadcastGroup": "genrm_serve.engines.weights",
    "ipc_handle": "genrm_serve.engines.weights",
    "open_ipc_handle": "genrm_serve.engines.weights",
    "pack_bucket": "genrm_serve.engines.weights",
    "plan_buckets": "genrm_serve.engines.weights",
    "unpack_bucket": "genrm_serve.engines.weights",
    # running on Ray, models
    "LOCAL_RAY_ENV": "genrm_serve.ray_env",
    "apply_ray_env_defaults": "genrm_serve.ray_env",
    "check_model_path": "genrm_serve.models",
    "check_instance_files": "genrm_serve.preflight",
    "InstanceFileError": "genrm_serve.preflight",
    "default_cache_dir": "genrm_serve.models",
    "is_embedded": "genrm_serve.models",
    "resolve_model_path": "genrm_serve.models",
    # the precision rule shared by the hf engine and the trainer
    "CpuBf16Probe": "genrm_serve.precision",
    "probe_cpu_bf16": "genrm_serve.precision",
    "resolve_bf16": "genrm_serve.precision",
}

#: old public name → the name it is now (resolved through :data:`_EXPORTS`)
_ALIASES: dict[str, str] = {
    "EngineActor": "RemoteEngine",  # the caller's side of an engine actor, not the actor
}

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "ENGINE_START_TIMEOUT_S",
    "LOCAL_RAY_ENV",
    "WEIGHT_GROUP_TIMEOUT_S",
    "BucketMeta",
    "CapacityError",
    "CpuBf16Probe",
    "Engine",
    "EngineActor",
    "EngineAsleepError",
    "EngineConfig",
    "EngineError",
    "EngineFailedError",
    "EngineGoneError",
    "EngineOutput",
    "EnginePlacement",
    "EngineRef",
    "EngineRequest",
    "EngineStartError",
    "EngineWorker",
    "GenRMConfigError",
    "HostOffloader",
    "InstanceFileError",
    "InstanceSpec",
    "RemoteEngine",
    "ServeArgs",
    "ServeRunningError",
    "WeightBroadcastGroup",
    "__version__",
    "add_genrm_args",
    "apply_ray_env_defaults",
    "build_app",
    "check_fits",
    "check_instance_files",
    "check_model_path",
    "check_owned_server_args",
    "check_service_fits",
    "cluster_capacity",
    "create_engine_worker",
    "default_cache_dir",
    "deploy",
    "dtype_from_name",
    "engine_id_for",
    "instances_from_args",
    "invalid_json",
    "ipc_handle",
    "is_embedded",
    "open_ipc_handle",
    "pack_bucket",
    "plan_buckets",
    "probe_cpu_bf16",
    "refuse_another_serve",
    "resolve_bf16",
    "resolve_model_path",
    "serve_namespace",
    "shutdown_serve",
    "start_proxy",
    "unpack_bucket",
    "wait_until_healthy",
]


def __getattr__(name: str) -> Any:
    target = _ALIASES.get(name, name)
    module = _EXPORTS.get(target)
    if module is None:
        raise AttributeError(f"module 'genrm_serve' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), target)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # the names as type checkers see them
    from genrm_serve.app import (
        EngineStartError,
        ServeRunningError,
        build_app,
        deploy,
        refuse_another_serve,
        serve_namespace,
        shutdown_serve,
        start_proxy,
        wait_until_healthy,
    )
    from genrm_serve.capacity import (
        CapacityError,
        check_fits,
        check_service_fits,
        cluster_capacity,
    )
    from genrm_serve.config import (
        EngineConfig,
        GenRMConfigError,
        InstanceSpec,
        add_genrm_args,
        instances_from_args,
        invalid_json,
    )
    from genrm_serve.engine_refs import EnginePlacement, EngineRef
    from genrm_serve.engines.base import (
        Engine,
        EngineAsleepError,
        EngineError,
        EngineFailedError,
        EngineOutput,
        EngineRequest,
        engine_id_for,
    )
    from genrm_serve.engines.remote import EngineGoneError, RemoteEngine
    from genrm_serve.engines.sglang.launch import check_owned_server_args
    from genrm_serve.engines.weights import (
        DEFAULT_BUCKET_BYTES,
        BucketMeta,
        HostOffloader,
        WeightBroadcastGroup,
        dtype_from_name,
        ipc_handle,
        open_ipc_handle,
        pack_bucket,
        plan_buckets,
        unpack_bucket,
    )
    from genrm_serve.engines.worker import EngineWorker, create_engine_worker
    from genrm_serve.limits import ENGINE_START_TIMEOUT_S, WEIGHT_GROUP_TIMEOUT_S
    from genrm_serve.models import (
        check_model_path,
        default_cache_dir,
        is_embedded,
        resolve_model_path,
    )
    from genrm_serve.precision import CpuBf16Probe, probe_cpu_bf16, resolve_bf16
    from genrm_serve.preflight import InstanceFileError, check_instance_files
    from genrm_serve.ray_env import LOCAL_RAY_ENV, apply_ray_env_defaults
    from genrm_serve.serve_args import ServeArgs

    EngineActor = RemoteEngine  # the old name (see _ALIASES)
