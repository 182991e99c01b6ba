"""Model-parallel flags with Megatron's names, and the rule that ties them to the actor's GPUs.

Data parallelism is what is left over: ``dp = actor GPUs / (TP × PP)``. The check is a pure
function so ``rl-core train`` can refuse a layout at parse time, before any process starts.
"""

from __future__ import annotations

import argparse
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ParallelConfigError(ValueError):
    """Model-parallel sizes that do not fit the actor's GPUs; names the flags and the numbers."""


class MegatronConfig(BaseModel):
    """The Megatron backend's own settings (the ``--tensor-model-parallel-size`` family)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tensor_model_parallel_size: int = Field(default=1, ge=1)
    pipeline_model_parallel_size: int = Field(default=1, ge=1)
    sequence_parallel: bool = False
    #: Megatron's ``--transformer-impl``: ``local`` (torch layers + SDPA attention, no extra
    #: dependency) or ``transformer_engine`` (needs Transformer Engine installed).
    transformer_impl: Literal["local", "transformer_engine"] = "local"

    @property
    def model_parallel_size(self) -> int:
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    def data_parallel_size(self, actor_gpus: int) -> int:
        check_parallel_sizes(actor_gpus, self)
        return actor_gpus // self.model_parallel_size


#: The flags this module owns, as ``TrainConfig`` field names (for the config merge).
MEGATRON_FIELDS = tuple(MegatronConfig.model_fields)


def add_megatron_args(parser: argparse.ArgumentParser) -> None:
    """Add the Megatron backend's flags (only used with ``--train-backend megatron``)."""
    g = parser.add_argument_group("megatron backend (--train-backend megatron)")
    g.add_argument(
        "--tensor-model-parallel-size",
        type=int,
        default=1,
        help="tensor parallelism: each layer's weights split over this many GPUs",
    )
    g.add_argument(
        "--pipeline-model-parallel-size",
        type=int,
        default=1,
        help="pipeline parallelism (only 1 is supported by this backend today)",
    )
    g.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="split norms and dropout activations along the sequence over the TP group",
    )
    g.add_argument(
        "--transformer-impl",
        choices=["local", "transformer_engine"],
        default="local",
        help="layer implementation: local (torch, SDPA attention) or transformer_engine",
    )


def megatron_config_from(values: Any) -> MegatronConfig:
    """Build the config from a namespace, a mapping or a ``TrainConfig`` with the same fields."""
    found: dict[str, Any] = {}
    for k in MEGATRON_FIELDS:
        default = MegatronConfig.model_fields[k].default
        found[k] = (
            values.get(k, default) if isinstance(values, dict) else getattr(values, k, default)
        )
    return MegatronConfig(**found)


def check_parallel_sizes(actor_gpus: int, cfg: MegatronConfig) -> None:
    """Refuse sizes that do not divide the actor's GPUs (or that this backend cannot run).

    Raises :class:`ParallelConfigError` naming the flags and the numbers.
    """
    tp, pp = cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size
    if pp != 1:
        raise ParallelConfigError(
            f"--pipeline-model-parallel-size {pp}: only 1 is supported by the megatron backend "
            "(no pipeline schedule yet); use --tensor-model-parallel-size and data parallelism"
        )
    if actor_gpus % (tp * pp) != 0:
        raise ParallelConfigError(
            f"actor GPUs {actor_gpus} must be a multiple of --tensor-model-parallel-size {tp} × "
            f"--pipeline-model-parallel-size {pp} = {tp * pp} (data parallel = actor GPUs / "
            "(TP × PP))"
        )
    if cfg.sequence_parallel and cfg.transformer_impl == "local":
        raise ParallelConfigError(
            "--sequence-parallel needs --transformer-impl transformer_engine: Megatron's torch "
            "norms (the local implementation) do not support sequence parallelism"
        )
    if cfg.sequence_parallel and tp == 1:
        raise ParallelConfigError(
            "--sequence-parallel needs --tensor-model-parallel-size > 1 (it splits activations "
            "over the tensor-parallel group); got --tensor-model-parallel-size 1"
        )
