"""Resuming a cut stream: what reached the client, the continuation request, and its events as the client sees them.

A stream whose decode instance died part-way is resumed on another decode instance (:mod:`router.migrate`) by
re-submitting the prompt followed by the text already streamed, as vLLM's OpenAI API allows:

* ``/v1/completions``: ``prompt`` = the original prompt + the streamed text;
* ``/v1/chat/completions``: the messages plus an open assistant message holding the streamed text, with
  ``continue_final_message: true`` and ``add_generation_prompt: false`` (vLLM's chat parameters);

with ``max_tokens`` / ``max_completion_tokens`` (and ``min_tokens``) reduced by the tokens already produced. A
greedy model continues such a prompt exactly where the cut stream stopped (the emulator does, by construction);
a sampling one continues it plausibly. Re-tokenising the text may split it differently from the original tokens.

The client sees one stream: only whole SSE events are passed on (a cut half-event never reaches it), and the
continuation's events are rewritten: the chat role-only chunk is dropped when the client had one, ``id`` is the
cut stream's, and ``usage`` moves the tokens already streamed from ``prompt_tokens`` back to
``completion_tokens`` (so ``prompt_tokens`` is the original prompt's and ``completion_tokens`` counts every token
streamed across attempts). Tokens already produced = content events delivered (vLLM streams one per token by
default; the router counts output tokens the same way).

Not resumable: ``n`` > 1, ``best_of``, ``echo``, token-id prompts (there is no text to append).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Delivered", "StreamTranscript", "continuation_body", "generation_over", "stream_tail"]

_EVENT_END = b"\n\n"
_DATA = b"data: "
_DONE_PAYLOAD = b"[DONE]"


@dataclass(frozen=True, slots=True)
class Delivered:
    """What a stream had delivered to the client when it was cut."""

    text: str
    """The generated text, in order (all choices' ``text`` / ``delta.content``)."""
    tokens: int
    """Output tokens delivered (content events; the chat role-only chunk is not one)."""
    role_sent: bool
    """A chat role-only chunk reached the client."""
    finished: bool
    """A choice carried a ``finish_reason``: generation was over, only the usage chunk and ``[DONE]`` are missing."""
    last_event: dict[str, Any] | None
    """The last JSON event delivered (its ``id``, ``object``, ``created``, ``model`` head a synthesised tail)."""
    usage: dict[str, Any] | None
    """The last ``usage`` delivered (continuous usage statistics), if any."""
    error: str | None = None
    """The message of the first error event delivered, if any (an instance that failed and said so)."""


def _payloads(data: bytes) -> list[bytes]:
    """The ``data:`` payloads of whole SSE events."""
    out: list[bytes] = []
    for event in data.split(_EVENT_END):
        line = event.strip()
        if line.startswith(_DATA):
            out.append(line[len(_DATA) :])
    return out


def _is_role_only(event: Mapping[str, Any]) -> bool:
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    for choice in choices:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict) or "role" not in delta or delta.get("content"):
            return False
    return True


def _content(event: Mapping[str, Any]) -> tuple[str, bool, bool]:
    """(text, is a content event, carries a finish_reason) of one stream event."""
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices:
        return "", False, False
    parts: list[str] = []
    content = finished = False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        finished = finished or choice.get("finish_reason") is not None
        delta = choice.get("delta")
        text = choice.get("text") if "text" in choice else delta.get("content") if isinstance(delta, dict) else None
        if isinstance(text, str):
            parts.append(text)
            content = True
    return "".join(parts), content, finished


class StreamTranscript:
    """Passes a stream's whole SSE events to the client and remembers them; rewrites a continuation's events.

    :meth:`feed` is the relay's framing hook (:func:`router.relay.relay`): it returns the bytes to write now,
    holding back an incomplete last event until its end arrives. After a cut, :meth:`resume` reports what was
    delivered and switches to continuation mode for the next upstream stream. Memory: the delivered events of
    the stream (about 150-250 bytes per token), parsed only if the stream is cut.
    """

    __slots__ = ("_continuing", "_drop_role", "_id", "_passed", "_shift_tokens", "_tail")

    def __init__(self) -> None:
        self._tail = b""
        self._passed: list[bytes] = []
        self._continuing = False
        self._shift_tokens = 0
        self._drop_role = False
        self._id: Any = None

    def feed(self, chunk: bytes) -> bytes:
        """The whole events of (held-back tail +) ``chunk`` to write to the client now, rewritten if continuing."""
        data = self._tail + chunk if self._tail else chunk
        end = data.rfind(_EVENT_END)
        if end < 0:
            self._tail = data
            return b""
        end += len(_EVENT_END)
        out, self._tail = data[:end], data[end:]
        if self._continuing:
            out = self._rewrite(out)
        if out:
            self._passed.append(out)
        return out

    def delivered(self) -> Delivered:
        """What the client has received so far (parses the remembered events)."""
        texts: list[str] = []
        tokens = 0
        role_sent = finished = False
        last: dict[str, Any] | None = None
        usage: dict[str, Any] | None = None
        error: str | None = None
        for payload in _payloads(b"".join(self._passed)):
            if payload == _DONE_PAYLOAD:
                continue
            try:
                event = json.loads(payload)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            if "error" in event:
                detail = event["error"]
                message = detail.get("message") if isinstance(detail, dict) else detail
                error = error or str(message)
                continue
            last = event
            if isinstance(event.get("usage"), dict):
                usage = event["usage"]
            if _is_role_only(event):
                role_sent = True
                continue
            text, content, done = _content(event)
            texts.append(text)
            tokens += content
            finished = finished or done
        return Delivered("".join(texts), tokens, role_sent, finished, last, usage, error)

    def resume(self) -> Delivered:
        """Report what was delivered and rewrite the next upstream stream as its continuation."""
        delivered = self.delivered()
        self._tail = b""  # a half event of the cut stream never reached the client
        self._continuing = True
        self._shift_tokens = delivered.tokens
        self._drop_role = delivered.role_sent
        self._id = delivered.last_event.get("id") if delivered.last_event else None
        return delivered

    def _rewrite(self, data: bytes) -> bytes:
        out: list[bytes] = []
        for payload in _payloads(data):
            if payload == _DONE_PAYLOAD:
                out.append(_DATA + payload + _EVENT_END)
                continue
            try:
                event = json.loads(payload)
            except ValueError:
                out.append(_DATA + payload + _EVENT_END)
                continue
            if not isinstance(event, dict):
                out.append(_DATA + payload + _EVENT_END)
                continue
            if self._drop_role and _is_role_only(event):
                self._drop_role = False
                continue
            if self._id is not None and "id" in event:
                event["id"] = self._id
            usage = event.get("usage")
            if isinstance(usage, dict):
                event["usage"] = _shift_usage(usage, self._shift_tokens)
            out.append(_DATA + json.dumps(event, separators=(",", ":")).encode() + _EVENT_END)
        return b"".join(out)


def _shift_usage(usage: Mapping[str, Any], tokens: int) -> dict[str, Any]:
    """A continuation's usage as the whole stream's: ``tokens`` move from the prompt back to the completion."""
    out = dict(usage)
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        out["prompt_tokens"] = max(prompt - tokens, 0)
        out["completion_tokens"] = completion + tokens
    return out


def generation_over(body: Mapping[str, Any], delivered: Delivered) -> bool:
    """Whether the cut stream had every token: a ``finish_reason``, or as many tokens as ``max_tokens``."""
    if delivered.finished:
        return True
    limits = [body.get(k) for k in ("max_completion_tokens", "max_tokens")]
    limit = next((v for v in limits if isinstance(v, int) and not isinstance(v, bool)), None)
    return limit is not None and delivered.tokens >= limit


def continuation_body(body: Mapping[str, Any], chat: bool, delivered: Delivered) -> bytes | None:
    """The request that continues a cut stream after ``delivered`` (None: the request cannot be resumed).

    Call only when :func:`generation_over` is False.
    """
    if _count(body.get("n")) > 1 or _count(body.get("best_of")) > 1 or body.get("echo"):
        return None
    out = dict(body)
    out.pop("kv_transfer_params", None)
    if delivered.text:
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return None
            if body.get("continue_final_message"):
                last = messages[-1]
                if not isinstance(last, dict) or not isinstance(last.get("content"), str):
                    return None
                out["messages"] = [*messages[:-1], {**last, "content": last["content"] + delivered.text}]
            else:
                if body.get("add_generation_prompt") is False:
                    return None
                out["messages"] = [*messages, {"role": "assistant", "content": delivered.text}]
            out["add_generation_prompt"] = False
            out["continue_final_message"] = True
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1:
                prompt = prompt[0]
            if not isinstance(prompt, str):
                return None
            out["prompt"] = prompt + delivered.text
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            if value - delivered.tokens < 1:
                return None
            out[key] = value - delivered.tokens
    for key in ("min_tokens", "min_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = max(value - delivered.tokens, 0)
    return json.dumps(out, separators=(",", ":")).encode()


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def stream_tail(body: Mapping[str, Any], delivered: Delivered, prompt_tokens: int) -> bytes:
    """The end of a stream cut after its last token: the usage chunk (if asked for) and ``[DONE]``.

    ``prompt_tokens``: the router's count of the prompt, used when no usage was delivered with the tokens.
    """
    options = body.get("stream_options")
    tail = b""
    if isinstance(options, dict) and options.get("include_usage"):
        head: dict[str, Any] = delivered.last_event or {}
        prompt = delivered.usage.get("prompt_tokens") if delivered.usage else None
        prompt = prompt if isinstance(prompt, int) else prompt_tokens
        chunk: dict[str, Any] = {
            **{k: head[k] for k in ("id", "object", "created", "model") if k in head},
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "total_tokens": prompt + delivered.tokens,
                "completion_tokens": delivered.tokens,
            },
        }
        tail = _DATA + json.dumps(chunk, separators=(",", ":")).encode() + _EVENT_END
    return tail + _DATA + _DONE_PAYLOAD + _EVENT_END
