"""The embedded judge's training: labelled examples by construction, and the LoRA trainer.

Kept out of genrm-rewards (whose wheel a trainer installs for its reward functions) because its
audience and lifecycle differ: the generators are frozen by seed (the shipped adapter's pairs),
and the trainer needs torch, transformers and peft through genrm-serve's ``hf`` extra. Importing
this package imports none of them; ``genrm_judge_train.cli`` is the ``genrm-judge-train``
command.
"""

from importlib.metadata import version as _version

__version__ = _version("genrm-judge-train")

__all__ = ["__version__"]
