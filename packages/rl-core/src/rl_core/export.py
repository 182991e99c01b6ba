"""``rl-core export CHECKPOINT OUT``: a checkpoint of either backend as a Hugging Face folder.

A checkpoint (``--save``'s ``step_NNNNNN/``) holds the weights in fp32 plus Adam's two moments,
about 12 bytes a parameter, in the backend's own layout beside an HF folder ``model/``: both
backends write that folder with the full weights under HF names (the Megatron backend gathers
its tensor-parallel shards into it at save time, through ``megatron.convert.megatron_to_hf``).
An export turns it into what the rest of the world loads: ``config.json`` (``dtype`` and
``torch_dtype`` the chosen one, ``use_cache`` as the base model has it), the weights in
safetensors in that dtype (bf16 by default: 2 bytes a parameter, no optimizer state), and the
base model's tokenizer files and ``generation_config.json``. The folder loads with
``AutoModelForCausalLM.from_pretrained``, as ``rl-core train --hf-checkpoint``, in genrm-serve and
in SGLang.

The base model is the ``--hf-checkpoint`` the run trained, which every checkpoint records in its
``state.json`` (``extra.base_model``); ``--base-model`` names it for a checkpoint that does not.
Every input is checked before a weight is read, and the folder is written under a hidden name
next to ``OUT`` and renamed into place: an interrupted export never leaves a folder that looks
complete. ``rl-core train --save-hf DIR`` writes the same folder at the end of a run, from the
learner's weights (:func:`save_backend_hf`, on the trainer's ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_core.checkpoints import STATE_FILE, checkpoint_path, read_checkpoint_state
from rl_core.folders import folder_problem

if TYPE_CHECKING:
    import torch

__all__ = [
    "BASE_MODEL_KEY",
    "DTYPES",
    "ExportError",
    "ExportSource",
    "base_model_record",
    "check_out_dir",
    "export_hf",
    "find_export_source",
    "save_backend_hf",
    "write_hf_folder",
]

#: ``--dtype`` name → the name transformers writes in ``config.json`` (``dtype``).
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
#: The key of a checkpoint's ``state.json`` ``extra`` naming the model the run started from.
BASE_MODEL_KEY = "base_model"
#: The HF folder inside a checkpoint (both backends write it).
MODEL_DIR = "model"
#: Files of the base model copied as they are: the tokenizer in its every known form.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
GENERATION_CONFIG = "generation_config.json"
#: Largest safetensors file written; a bigger model is sharded with an index, as transformers does.
SHARD_BYTES = 5 * 2**30
#: ``config.json`` keys that must agree between the checkpoint and its base model.
_SAME_ARCHITECTURE = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers")


class ExportError(ValueError):
    """An export refused before any weight is read; the message names the input, its value and
    the rule."""


@dataclass(frozen=True)
class ExportSource:
    """A checkpoint to export, checked: its folder, its HF folder, the base model's folder."""

    #: the step folder (``SAVE/latest`` resolved)
    checkpoint: Path
    #: the checkpoint's HF folder (``model/``: config.json + safetensors)
    model_dir: Path
    #: the base model's folder (tokenizer and generation config come from there)
    base_dir: Path
    #: the rollout step the checkpoint completed (None when its state does not say)
    step: int | None


def base_model_record(hf_checkpoint: str) -> str:
    """What a checkpoint records as its base model: ``embedded[:name]`` as it is (it resolves on
    any machine), a folder as an absolute path (the export may run from elsewhere)."""
    from genrm_serve import is_embedded

    if is_embedded(hf_checkpoint):
        return hf_checkpoint
    return str(Path(hf_checkpoint).expanduser().resolve())


def _dtype_name(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype}: unknown; one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def check_out_dir(flag: str, out: str | Path, *, force: bool = False) -> None:
    """``out`` (given as ``flag``) may become the folder: absent, or an empty folder (or anything,
    with ``force``), and its parent writable. Raises :class:`ExportError`."""
    hint = "choose a new folder (or --force to replace it)"
    problem = folder_problem(flag, out, must_be_empty=True, force=force, if_not_empty=hint)
    if problem:
        raise ExportError(problem)


def _read_config(folder: Path) -> dict[str, Any]:
    config = json.loads((folder / "config.json").read_text())
    if not isinstance(config, dict):
        raise ValueError("config.json is not an object")
    return config


def _resolve_base(base_model: str, flag: str) -> Path:
    from genrm_serve import resolve_model_path

    try:
        base = resolve_model_path(base_model)
    except FileNotFoundError as err:
        raise ExportError(f"{flag} {base_model}: {str(err).split(': ', 1)[-1]}") from None
    if not any((base / f).is_file() for f in TOKENIZER_FILES):
        raise ExportError(
            f"{flag} {base_model}: no tokenizer files there (one of tokenizer.json, "
            "tokenizer_config.json, tokenizer.model, ...); the exported folder would not load "
            "in genrm-serve or SGLang without one"
        )
    return base


def find_export_source(checkpoint: str | Path, *, base_model: str | None = None) -> ExportSource:
    """The checkpoint a path means (a ``--save`` folder: its ``latest`` step; or a step folder)
    and its base model, every rule checked, no weight read. Raises :class:`ExportError`."""
    root = Path(checkpoint).expanduser()
    if not root.is_dir():
        raise ExportError(f"CHECKPOINT {checkpoint}: no such folder")
    path = checkpoint_path(root)
    model_dir = path / MODEL_DIR
    if not (path / STATE_FILE).is_file() or not (model_dir / "config.json").is_file():
        raise ExportError(
            f"CHECKPOINT {checkpoint}: not a checkpoint (no {STATE_FILE} and {MODEL_DIR}/"
            f"config.json in {path}); give a --save folder (its latest step) or one of its "
            "step_* folders"
        )
    if not any(model_dir.glob("*.safetensors")):
        raise ExportError(f"CHECKPOINT {checkpoint}: {model_dir} holds no *.safetensors weights")
    try:
        extra = read_checkpoint_state(path)["extra"]
    except (ValueError, KeyError, TypeError) as err:
        raise ExportError(
            f"CHECKPOINT {checkpoint}: unreadable {path / STATE_FILE}: {err}"
        ) from None
    flag = "--base-model"
    if base_model is None:
        recorded = extra.get(BASE_MODEL_KEY)
        if not isinstance(recorded, str):
            raise ExportError(
                f"CHECKPOINT {checkpoint}: {path / STATE_FILE} records no {BASE_MODEL_KEY} "
                "(written before checkpoints did); pass --base-model PATH, the --hf-checkpoint "
                "the run trained (for its tokenizer and generation config)"
            )
        base_model, flag = recorded, f"{BASE_MODEL_KEY} (recorded in {path / STATE_FILE})"
    base = _resolve_base(base_model, flag)
    mine, theirs = _read_config(model_dir), _read_config(base)
    for key in _SAME_ARCHITECTURE:
        if key in mine and key in theirs and mine[key] != theirs[key]:
            raise ExportError(
                f"{flag} {base_model}: its {key} is {theirs[key]!r}, the checkpoint's is "
                f"{mine[key]!r}; the base model must be the one the run trained"
            )
    step = extra.get("rollout_step")
    return ExportSource(path, model_dir, base, int(step) if isinstance(step, int) else None)


# --- writing -----------------------------------------------------------------------------------


def _checkpoint_tensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The HF folder's tensors one at a time (a file is never read whole into memory)."""
    from safetensors import safe_open

    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is no mapping)
                yield name, f.get_tensor(name)


def _write_shards(
    tensors: Iterable[tuple[str, torch.Tensor]], folder: Path, dtype: torch.dtype
) -> None:
    """Floating tensors cast to ``dtype`` (others as they are), written in files of at most
    :data:`SHARD_BYTES`: ``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` and
    ``model.safetensors.index.json`` as transformers names them."""
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors:
        t = t.detach().to("cpu", dtype if t.is_floating_point() else t.dtype).contiguous()
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(folder / "model.safetensors"), metadata=meta)
        return
    weight_map, total = {}, 0
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / name), metadata=meta)
        for k, t in shard.items():
            weight_map[k] = name
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _publish(tmp: Path, out: Path) -> None:
    """``tmp`` becomes ``out``; a folder already there (empty, or replaced with ``force``) is
    moved aside first and deleted after, so ``out`` is never half written."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_hf_folder(
    tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
    out_dir: str | Path,
    *,
    config_dir: str | Path,
    base_dir: str | Path,
    dtype: str = "bf16",
    force: bool = False,
) -> Path:
    """Write HF-named weights as an HF folder at ``out_dir``: ``config_dir``'s config.json
    (``dtype`` set, ``use_cache`` as the base model has it), the weights cast to ``dtype``, and
    ``base_dir``'s tokenizer files and generation config. Atomic (a hidden folder beside it,
    renamed into place). Returns ``out_dir``."""
    import torch

    out = Path(out_dir).expanduser()
    name = _dtype_name(dtype)
    check_out_dir("OUT", out, force=force)
    base = Path(base_dir)
    config = _read_config(Path(config_dir))
    # "dtype" is what transformers >= 4.56 reads; "torch_dtype" what older ones (SGLang's
    # images among them) read: both, so the folder loads as ``dtype`` everywhere
    config["dtype"] = config["torch_dtype"] = name
    # the torch backend trains with use_cache off; an inference folder wants the base's setting
    config["use_cache"] = _read_config(base).get("use_cache", True)
    tmp = out.absolute().with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        items = tensors.items() if isinstance(tensors, Mapping) else tensors
        _write_shards(items, tmp, getattr(torch, name))
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for f in (*TOKENIZER_FILES, GENERATION_CONFIG):
            if (base / f).is_file():
                shutil.copy2(base / f, tmp / f)
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def export_hf(
    checkpoint_dir: str | Path,
    out_dir: str | Path,
    *,
    dtype: str = "bf16",
    base_model: str | None = None,
    force: bool = False,
) -> Path:
    """Export a checkpoint of either backend (a ``--save`` folder: its latest step; or a step
    folder) as an HF folder at ``out_dir`` in ``dtype`` (``bf16``, ``fp16`` or ``fp32``), with
    the tokenizer and generation config of ``base_model`` (default: the one the checkpoint
    records). Every input is checked before a weight is read (:class:`ExportError`). Returns
    ``out_dir``."""
    _dtype_name(dtype)
    check_out_dir("OUT", out_dir, force=force)
    source = find_export_source(checkpoint_dir, base_model=base_model)
    out = Path(out_dir).expanduser().absolute()
    for a, b in ((out, source.checkpoint.absolute()), (source.checkpoint.absolute(), out)):
        if a == b or a in b.parents:
            raise ExportError(f"OUT {out_dir}: overlaps the checkpoint {source.checkpoint}")
    return write_hf_folder(
        _checkpoint_tensors(source.model_dir),
        out_dir,
        config_dir=source.model_dir,
        base_dir=source.base_dir,
        dtype=dtype,
        force=force,
    )


def save_backend_hf(backend: Any, path: str | Path, dtype: str, *, write: bool = True) -> None:
    """``--save-hf``: a training backend's policy as an HF folder at ``path``, with the config,
    tokenizer and generation config of the model it was built from (``backend.model_path``).
    Every rank of a Megatron policy calls it (the export gathers over TP); only ``write`` ranks
    write."""
    weights = backend.export_weights()
    if write:
        write_hf_folder(
            weights,
            path,
            config_dir=backend.model_path,
            base_dir=backend.model_path,
            dtype=dtype,
        )


# --- the ``rl-core export`` subcommand -----------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write a checkpoint (torch or Megatron backend) as a Hugging Face folder: config.json, "
        "safetensors weights in --dtype, and the base model's tokenizer and generation config."
    )
    parser.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a --save folder (its latest step) or one of its step_* folders",
    )
    parser.add_argument("out", metavar="OUT", help="the folder to write (absent or empty)")
    parser.add_argument(
        "--dtype",
        default="bf16",
        metavar="{" + ",".join(DTYPES) + "}",
        help="dtype of the exported weights (default: bf16)",
    )
    parser.add_argument(
        "--base-model",
        default=None,
        metavar="PATH",
        help="the model the run trained (--hf-checkpoint, e.g. embedded:gemma3-270m), for its "
        "tokenizer and generation config (default: the one the checkpoint records)",
    )
    parser.add_argument("--force", action="store_true", help="replace OUT if it is not empty")


def run(args: argparse.Namespace) -> int:
    """Exit status: 0 written, 2 a bad input (refused before any weight is read)."""
    try:
        out = export_hf(
            args.checkpoint,
            args.out,
            dtype=args.dtype,
            base_model=args.base_model,
            force=args.force,
        )
    except ExportError as err:
        print(f"rl-core export: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0
