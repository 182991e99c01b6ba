"""Training backends behind one small interface (log-probs, train step, weights, offload/onload)."""

from rl_core.backends.base import BackendConfig, TrainingBackend, TrainItem

__all__ = ["BackendConfig", "TrainItem", "TrainingBackend"]
