"""Deterministic token counting and text generation for the emulator and the load generator.

The emulator has no model weights, so it cannot tokenise like a real model. It uses one fixed rule instead:
a text of ``n`` characters is ``ceil(n / CHARS_PER_TOKEN)`` tokens (4 characters per token, the usual
calibration for English text with Llama-3 and GPT tokenisers). Token ids are a CRC-32 of each 4-character
piece modulo :data:`VOCAB_SIZE`, so ``/tokenize`` is stable across runs and processes. The router's
default estimate (``chars_per_token: 4``) uses the same ratio, so against the emulator the router's input
estimate is exact; against a real vLLM it is an estimate.

Generated text is a deterministic function of the context, like greedy decoding: each output token is a
4-character word (exactly one token under this rule) chosen by the CRC-32 of everything before it, the prompt
and the tokens generated so far (:class:`OutputText`). So a request whose prompt is another request's prompt
plus the first ``k`` tokens it generated continues with exactly that request's token ``k``, ``k + 1``, ... (the
router's request migration relies on it). Prompt blocks draw their words from a generator seeded by a BLAKE2
hash of the block's key, so unrelated prompts do not share text.

:func:`prompt_text` builds a prompt of an exact token count from Mooncake-style prefix-block hashes, so two
requests that share leading hash ids share leading text (and therefore prefix-cache hits, in the emulator and
in the router's estimate alike).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence

import numpy as np

__all__ = [
    "CHARS_PER_TOKEN",
    "VOCAB_SIZE",
    "OutputText",
    "count_tokens",
    "generated_text",
    "prompt_text",
    "token_ids",
]

CHARS_PER_TOKEN = 4
"""Characters per token of the emulator's tokeniser (and the router's default estimate)."""
VOCAB_SIZE = 128_256
"""Vocabulary size reported by token ids (Llama-3's)."""

_SYLLABLES = ("ka", "lo", "mi", "nu", "re", "sa", "ti", "vo", "be", "do", "fe", "gu", "ha", "ji", "pe", "zu")


def count_tokens(text: str) -> int:
    """Number of tokens in ``text`` (``ceil(len / CHARS_PER_TOKEN)``)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def token_ids(text: str) -> list[int]:
    """Deterministic token ids of ``text``: one per 4-character piece."""
    data = text.encode("utf-8", "surrogatepass")
    step = CHARS_PER_TOKEN
    if len(data) == len(text):  # ASCII: byte offsets equal character offsets
        return [zlib.crc32(data[i : i + step]) % VOCAB_SIZE for i in range(0, len(data), step)]
    return [
        zlib.crc32(text[i : i + step].encode("utf-8", "surrogatepass")) % VOCAB_SIZE for i in range(0, len(text), step)
    ]


def _word(seed: int) -> str:
    """A 4-character word (one token) chosen by ``seed``; ends with a space so words concatenate."""
    return _SYLLABLES[seed & 15] + _SYLLABLES[(seed >> 4) & 15][0] + " "


class OutputText:
    """The output tokens of one context, one word per :meth:`next` (a running CRC-32 of the context)."""

    __slots__ = ("_state",)

    def __init__(self, prompt: str | bytes) -> None:
        data = prompt if isinstance(prompt, bytes) else prompt.encode("utf-8", "surrogatepass")
        self._state = zlib.crc32(data)

    def next(self) -> str:
        """The next output token's text (exactly one token); it joins the context."""
        word = _WORDS[self._state & 0xFF]
        self._state = zlib.crc32(word.encode(), self._state)
        return word


def generated_text(prompt: str, num_tokens: int) -> str:
    """The first ``num_tokens`` output tokens the emulator generates after ``prompt``.

    ``prompt``: a completion prompt, or a chat request's rendered prompt
    (:func:`livestack.emulator.protocol.chat_prompt_text`).
    """
    out = OutputText(prompt)
    return "".join(out.next() for _ in range(num_tokens))


def prompt_text(
    input_tokens: int,
    hash_ids: Sequence[int] = (),
    hash_block_tokens: int = 512,
    salt: str = "",
) -> str:
    """A prompt of exactly ``input_tokens`` tokens.

    Block ``k`` (``hash_block_tokens`` tokens) is derived from ``hash_ids[k]`` alone, so prompts sharing a
    leading run of hash ids share that leading text. Tokens past the last hash id are derived from ``salt``
    (use the request id to make the tail unique).

    Args:
        input_tokens: prompt length in tokens.
        hash_ids: Mooncake-style prefix-block hashes.
        hash_block_tokens: tokens per hash id.
        salt: seed of the tokens not covered by ``hash_ids``.
    """
    if input_tokens <= 0:
        return ""
    parts: list[str] = []
    remaining = input_tokens
    for block in hash_ids:
        if remaining <= 0:
            break
        n = min(hash_block_tokens, remaining)
        parts.append(_block_text(f"h{block}", n))
        remaining -= n
    if remaining > 0:
        parts.append(_block_text(f"s{salt}", remaining))
    return "".join(parts)


_WORDS = tuple(_word(k) for k in range(256))


def _block_text(key: str, num_tokens: int) -> str:
    seed = int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
    picks = np.random.default_rng(seed).integers(0, 256, num_tokens)
    words = _WORDS
    return "".join([words[k] for k in picks.tolist()])
