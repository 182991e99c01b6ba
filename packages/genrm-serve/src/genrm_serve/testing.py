"""Tiny random-weight causal LMs with a real tokenizer, built offline in about a second.

Tests across the workspace need a model that goes through exactly the code path of a real one
(tokenizer, chat template, ``from_pretrained``, KV cache, sampling, weight updates) but loads in
well under the time of a test. The weights are random, so the text is noise; what tests assert is
behaviour (shapes, determinism, limits, versions), never content. rl-core also trains one of these
as its tiny policy.

The tokenizer is a byte-level BPE trained on a small in-code corpus (any string round-trips), with
a chat template in the style of recent instruction models, including ``enable_thinking``.

It also holds the one "local Ray + Serve on a free loopback port" helper that every package's
tests use: several test sessions share one machine, so a fixed port (8000) or a plain
``ray.init()`` (which may join a stale cluster) would make them collide.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from genrm_serve.ray_env import apply_ray_env_defaults

__all__ = [
    "TINY_CHAT_TEMPLATE",
    "TINY_SPECIAL_TOKENS",
    "FakeSGLangEngine",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "free_port",
    "local_ray_serve",
    "ray_test_env",
]


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ray_test_env() -> None:
    """Set (``setdefault``) the env of a private test cluster; call before importing ray."""
    apply_ray_env_defaults(disable_auth=True)


@contextmanager
def local_ray_serve(num_cpus: int, port: int | None = None) -> Iterator[int]:
    """A fresh local Ray cluster with Serve's HTTP proxy on ``port`` (a free one when ``None``).

    Yields the port; shuts Serve and Ray down on exit.
    """
    ray_test_env()
    import ray
    from ray import serve

    port = free_port() if port is None else port
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield port
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()


#: Special tokens of the tiny tokenizer, in id order (ids 0..4).
TINY_SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>")

#: ChatML-like; ``enable_thinking=False`` pre-fills an empty think block (as Qwen3 does).
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)

_CORPUS = """
You are a careful judge. Compare the model's answer with the reference answer.
Reply 1 if they are consistent and 0 if they are not. The answer is 42. The reference is 42.
Problem: what is the sum of 3 and 4? Solution: 3 + 4 = 7, so the answer is \\boxed{7}.
Let x be a real number such that x^2 = 16. Then x = 4 or x = -4. Verdict: 1. Verdict: 0.
The quick brown fox jumps over the lazy dog. assistant user system <think> </think>
Integers, fractions \\frac{1}{2}, decimals 0.5, sets {1, 2}, and intervals [0, 1) appear in math.
"""


def build_tiny_tokenizer(vocab: int = 512) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` of at most ``vocab`` tokens, with a template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def build_tiny_model(
    path: str | Path,
    *,
    vocab: int = 512,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 4096,
    seed: int = 0,
    init_std: float = 0.2,
) -> Path:
    """Write a tiny random-weight Llama-architecture causal LM plus tokenizer to ``path``.

    Deterministic for a given ``seed``. ``init_std`` is larger than a trained model's init so that
    logits are peaked enough for greedy decoding to be stable across batch shapes. ``<|im_end|>``
    and ``<eos>`` both end generation. Returns ``path``.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(vocab)
    n_vocab = len(tokenizer)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in TINY_SPECIAL_TOKENS}
    config = LlamaConfig(
        vocab_size=n_vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        initializer_range=init_std,
        tie_word_embeddings=True,
        pad_token_id=ids["<pad>"],
        bos_token_id=ids["<bos>"],
        eos_token_id=[ids["<eos>"], ids["<|im_end|>"]],
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=ids["<bos>"],
        eos_token_id=[ids["<eos>"], ids["<|im_end|>"]],
        pad_token_id=ids["<pad>"],
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


class FakeSGLangEngine:
    """A *fake* of ``sglang.Engine`` (SGLang needs a GPU): same constructor and methods.

    It answers deterministic tokens derived from the prompt, and enforces what the real engine
    requires of its caller: no generate or weight update while the weights are released, known
    server arguments only. ``calls`` records every method called, in order, so tests can check
    the lifecycle (e.g. flush before release). Inject it with
    ``SGLangEngine(spec, id, engine_cls=FakeSGLangEngine)``.
    """

    #: Server arguments the fake accepts (those ``sglang_engine_kwargs`` may produce).
    KNOWN_ARGS = frozenset(
        {
            "model_path",
            "tp_size",
            "pp_size",
            "dp_size",
            "ep_size",
            "context_length",
            "enable_memory_saver",
            "enable_dp_attention",
            "mem_fraction_static",
            "dtype",
            "random_seed",
            "log_level",
        }
    )

    def __init__(self, **server_args: object) -> None:
        unknown = sorted(set(server_args) - self.KNOWN_ARGS)
        if unknown:
            raise TypeError(f"FakeSGLangEngine: unknown server argument(s) {unknown}")
        if "model_path" not in server_args:
            raise TypeError("FakeSGLangEngine: model_path is required")
        from transformers import AutoTokenizer

        self.server_args = dict(server_args)
        self.tokenizer = AutoTokenizer.from_pretrained(str(server_args["model_path"]))
        self.released: set[str] = set()
        self.calls: list[str] = ["__init__"]
        self.weight_names: list[str] = []

    def _fake_tokens(self, ids: list[int], n: int) -> list[int]:
        vocab = len(self.tokenizer)
        return [(sum(ids) * 31 + 7 * i) % (vocab - 10) + 10 for i in range(n)]

    def generate(
        self,
        prompt: object = None,
        sampling_params: object = None,
        input_ids: list[list[int]] | list[int] | None = None,
        return_logprob: bool = False,
        **_: object,
    ) -> object:
        self.calls.append("generate")
        if "weights" in self.released or "kv_cache" in self.released:
            raise RuntimeError("FakeSGLangEngine: generate while memory is released")
        if input_ids is None:
            raise TypeError("FakeSGLangEngine: only input_ids prompts are faked")
        rows: Any = input_ids
        single = bool(rows) and isinstance(rows[0], int)
        batch: list[list[int]] = [rows] if single else rows
        params: Any = (
            sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(batch)
        )
        outs = []
        for ids, p in zip(batch, params, strict=True):
            max_new = int((p or {}).get("max_new_tokens", 128))
            n = min(max_new, 4)
            toks = self._fake_tokens(ids, n)
            meta: dict[str, object] = {
                "prompt_tokens": len(ids),
                "completion_tokens": n,
                "finish_reason": {"type": "length"} if n == max_new else {"type": "stop"},
            }
            if return_logprob:
                meta["output_token_logprobs"] = [
                    (-0.25 * (i + 1), t, None) for i, t in enumerate(toks)
                ]
            outs.append(
                {
                    "text": self.tokenizer.decode(toks, skip_special_tokens=True),
                    "output_ids": toks,
                    "meta_info": meta,
                }
            )
        return outs[0] if single else outs

    def flush_cache(self) -> bool:
        self.calls.append("flush_cache")
        return True

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.calls.append("release_memory_occupation")
        self.released |= set(tags or ["weights", "kv_cache"])

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.calls.append("resume_memory_occupation")
        self.released -= set(tags or ["weights", "kv_cache"])

    def update_weights_from_tensor(
        self,
        named_tensors: list[tuple[str, object]],
        load_format: str | None = None,
        flush_cache: bool = True,
    ) -> tuple[bool, str]:
        self.calls.append("update_weights_from_tensor")
        if "weights" in self.released:
            raise RuntimeError("FakeSGLangEngine: weight update while weights are released")
        self.weight_names = [name for name, _ in named_tensors]
        return True, "Succeeded to update parameter online."

    def update_weights_from_disk(
        self, model_path: str, load_format: str | None = None
    ) -> tuple[bool, str]:
        self.calls.append("update_weights_from_disk")
        if "weights" in self.released:
            raise RuntimeError("FakeSGLangEngine: weight update while weights are released")
        return True, "Succeeded to update model weights."

    def shutdown(self) -> None:
        self.calls.append("shutdown")
