"""Putting untrusted text (the policy's answer) into a judge prompt so it cannot steer the judge.

The policy is optimised against the judge, so whatever it writes will, sooner or later, try to
instruct it: a fake ``[Standard Answer]:`` line, a ``Judgement: 1``, a closing delimiter
followed by new instructions, chat-template tokens (``<|im_end|>``, ``<end_of_turn>``) that a
tokenizer would turn into real turn boundaries. ``quote_untrusted`` makes that text inert:

1. it is capped in length (the head is kept: the final answer follows ``Answer:``);
2. control characters are blanked, and chat-template / special-token markers, our block
   delimiters and the template's own headers are rewritten into look-alikes that are plain text;
3. every line is prefixed with ``"| "`` between an opening and a closing marker line, so no line
   of the answer can start a template line, and the closing marker cannot occur inside.

The judge prompt then says that everything between the markers is data, not instructions.
"""

from __future__ import annotations

import re

__all__ = [
    "BLOCK_CLOSE",
    "BLOCK_OPEN",
    "LINE_PREFIX",
    "cap_text",
    "neutralise",
    "neutralised_kinds",
    "quote_untrusted",
]

BLOCK_OPEN = "<<<BEGIN {tag}>>>"
BLOCK_CLOSE = "<<<END {tag}>>>"
LINE_PREFIX = "| "

# <|im_end|>, <|eot_id|>, <｜end▁of▁sentence｜>-like, and named special tokens of common templates.
_SPECIAL_TOKEN = re.compile(
    r"<\|[^<>|\n]{0,64}\|>"
    r"|</?(?:start_of_turn|end_of_turn|bos|eos|s|pad|unk|think|im_start|im_end|"
    r"system|user|assistant|tool_call|tool_response)>"
    r"|\[/?INST\]|\[/?SYS\]|<</?SYS>>",
    re.IGNORECASE,
)
_DELIMITER_RUN = re.compile(r"<{3,}|>{3,}")
_TEMPLATE_HEADER = re.compile(r"\[(\s*(?:question|standard[ _]answer|model[ _]answer)\s*)\]", re.I)
_JUDGEMENT = re.compile(r"\b(judge?ment|verdict)\s*:", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u2028\u2029\u0085]")


def cap_text(text: str, max_chars: int) -> tuple[str, bool]:
    """Keep the first ``max_chars`` characters; return ``(text, was_truncated)``."""
    if len(text) <= max_chars:
        return text, False
    return text[:max_chars], True


def _defang_token(match: re.Match[str]) -> str:
    return (
        match.group(0)
        .replace("<", "‹")
        .replace(">", "›")
        .replace("|", "¦")
        .replace("[", "⟦")
        .replace("]", "⟧")
    )


def neutralise(text: str) -> str:
    """Rewrite every marker that could end the block or mimic the template into plain text."""
    text = _CONTROL.sub(" ", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _SPECIAL_TOKEN.sub(_defang_token, text)
    text = _DELIMITER_RUN.sub(
        lambda m: "‹" * len(m.group(0)) if m.group(0)[0] == "<" else "›" * len(m.group(0)), text
    )
    text = _TEMPLATE_HEADER.sub(r"(\1)", text)
    return _JUDGEMENT.sub(r"\1 -", text)


#: What :func:`neutralise` rewrites, by kind (the names :func:`neutralised_kinds` reports).
_KINDS = (
    ("control", _CONTROL),
    ("template_token", _SPECIAL_TOKEN),
    ("block_marker", _DELIMITER_RUN),
    ("template_header", _TEMPLATE_HEADER),
    ("judge_directed", _JUDGEMENT),
)


def neutralised_kinds(text: str) -> list[str]:
    """Which kinds of marker :func:`neutralise` rewrites in ``text`` (empty: none).

    An answer that carries template tokens, our block markers, the template's headers or a
    ``Judgement:`` line is one the policy may be aiming at the judge; rl-core's reward-hacking
    watch counts them per step, from the ``neutralised`` key of the reward result.
    """
    flat = text.replace("\r\n", "\n").replace("\r", "\n")
    return [kind for kind, pattern in _KINDS if pattern.search(flat)]


def quote_untrusted(text: str, *, tag: str, max_chars: int) -> tuple[str, bool]:
    """Return ``(block, was_truncated)``: ``text`` capped, neutralised and quoted between markers.

    ``tag`` names the block (``MODEL ANSWER``); it is trusted text chosen by the caller.
    """
    capped, truncated = cap_text(text, max_chars)
    body = neutralise(capped.strip())
    if truncated:
        body += f"\n[... answer truncated: {len(text) - max_chars} more characters not shown]"
    lines = body.split("\n") if body else [""]
    quoted = "\n".join(LINE_PREFIX + line for line in lines)
    return f"{BLOCK_OPEN.format(tag=tag)}\n{quoted}\n{BLOCK_CLOSE.format(tag=tag)}", truncated
