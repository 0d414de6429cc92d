"""vLLM's OpenAI-compatible wire format: request parsing, responses, SSE chunks and errors.

Only the parts of the protocol the emulator serves (see ``reference/vllm-interface.md`` §1 and §2). Bodies are
serialised with compact separators; fields vLLM leaves unset in stream chunks are omitted, fields it sets to
``None`` are ``null`` (as vLLM's ``exclude_unset`` serialisation does).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Literal

from livestack.emulator.tokenizer import count_tokens

__all__ = [
    "ApiError",
    "Kind",
    "ParsedRequest",
    "chat_prompt_text",
    "completion_body",
    "error_body",
    "parse_request",
    "sse_chunk",
    "sse_done",
    "sse_error",
    "sse_usage_chunk",
]

Kind = Literal["completion", "chat"]

DEFAULT_MAX_TOKENS = 16
"""vLLM's default ``max_tokens`` for completions."""

_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class ApiError(Exception):
    """An error answered in vLLM's shape ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The JSON body vLLM returns for an error."""
    return {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "InternalServerError"),
            "param": param,
            "code": status,
        }
    }


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated completion or chat request, reduced to what the emulator needs."""

    kind: Kind
    model: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    kv_transfer_params: dict[str, Any] | None
    echo_max_completion_tokens: bool

    @property
    def do_remote_decode(self) -> bool:
        """This request is a prefill leg: return KV transfer params for a decode instance."""
        return bool(self.kv_transfer_params and self.kv_transfer_params.get("do_remote_decode"))

    @property
    def do_remote_prefill(self) -> bool:
        """This request is a decode leg: pull the prompt's KV from the prefill instance, skip prefill."""
        return bool(self.kv_transfer_params and self.kv_transfer_params.get("do_remote_prefill"))


def chat_prompt_text(
    messages: list[Any], add_generation_prompt: bool = True, continue_final_message: bool = False
) -> str:
    """Render chat messages with a fixed template (role markers and contents, then the assistant marker).

    As vLLM's chat parameters: ``add_generation_prompt`` appends the assistant marker; ``continue_final_message``
    leaves the last message open (no end of turn), so generation continues its text. An open assistant message
    renders as the assistant marker followed by its text: a request continuing the first ``k`` output tokens of
    another request has exactly that request's prompt plus those tokens.
    """
    if add_generation_prompt and continue_final_message:
        raise ApiError(
            400,
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            "continue_final_message",
        )
    parts: list[str] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise ApiError(400, f"messages[{index}] must be an object with a 'role'", "messages")
        content = message.get("content")
        if isinstance(content, list):
            text = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        elif content is None or isinstance(content, str):
            text = content or ""
        else:
            raise ApiError(400, f"messages[{index}].content must be a string or a list of parts", "messages")
        parts.append(f"<|{message['role']}|>{text}\n")
    if continue_final_message and parts:
        parts[-1] = parts[-1][:-1]
    elif add_generation_prompt:
        parts.append("<|assistant|>")
    return "".join(parts)


def _int_field(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{key} must be an integer", key)
    if value < 1:
        raise ApiError(400, f"{key} must be at least 1, got {value}.", key)
    return value


def _bool_field(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise ApiError(400, f"{key} must be a boolean", key)
    return value


def _completion_prompt(body: dict[str, Any]) -> tuple[str, int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, count_tokens(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return "", len(prompt)
    if prompt is None:
        raise ApiError(400, "Either prompt or prompt_embeds must be provided.", "prompt")
    raise ApiError(400, "prompt must be a string, a token list or a list with one of these", "prompt")


def parse_request(kind: Kind, raw: bytes, served_model: str, max_model_len: int) -> ParsedRequest:
    """Validate a request body as vLLM does; raise :class:`ApiError` with vLLM's status and message."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"JSON decode error: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model") or served_model
    if model != served_model:
        raise ApiError(404, f"The model `{model}` does not exist.", "model")
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list", "messages")
        prompt = chat_prompt_text(
            messages,
            _bool_field(body, "add_generation_prompt", True),
            _bool_field(body, "continue_final_message", False),
        )
        prompt_tokens = count_tokens(prompt)
        max_tokens = _int_field(body, "max_completion_tokens") or _int_field(body, "max_tokens")
    else:
        prompt, prompt_tokens = _completion_prompt(body)
        max_tokens = _int_field(body, "max_tokens")
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS if kind == "completion" else max(max_model_len - prompt_tokens, 1)
    if prompt_tokens + max_tokens > max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion.",
        )
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    stream = bool(body.get("stream", False))
    if options and not stream:
        raise ApiError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
    params = body.get("kv_transfer_params")
    if params is not None and not isinstance(params, dict):
        raise ApiError(400, "kv_transfer_params must be an object", "kv_transfer_params")
    return ParsedRequest(
        kind=kind,
        model=model,
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
        continuous_usage=bool(options.get("continuous_usage_stats", False)),
        kv_transfer_params=params,
        echo_max_completion_tokens="max_completion_tokens" in body,
    )


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def completion_body(
    request: ParsedRequest,
    response_id: str,
    text: str,
    completion_tokens: int,
    finish_reason: str,
    kv_transfer_params: dict[str, Any] | None,
) -> bytes:
    """A non-streaming completion or chat response."""
    created = int(time.time())
    usage: dict[str, Any] = {**_usage(request.prompt_tokens, completion_tokens), "prompt_tokens_details": None}
    if request.kind == "chat":
        body: dict[str, Any] = {
            "id": response_id,
            "object": "chat.completion",
            "created": created,
            "model": request.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "tool_calls": []},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "stop_reason": None,
                }
            ],
            "usage": usage,
            "prompt_logprobs": None,
            "kv_transfer_params": kv_transfer_params,
        }
    else:
        body = {
            "id": response_id,
            "object": "text_completion",
            "created": created,
            "model": request.model,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "stop_reason": None,
                    "prompt_logprobs": None,
                }
            ],
            "usage": usage,
            "system_fingerprint": None,
            "kv_transfer_params": kv_transfer_params,
        }
    return _dumps(body)


def sse_chunk(
    request: ParsedRequest,
    response_id: str,
    created: int,
    text: str,
    finish_reason: str | None,
    usage: tuple[int, int] | None = None,
    role_only: bool = False,
) -> bytes:
    """One SSE ``data:`` event carrying ``text`` (a chat role-only chunk when ``role_only``)."""
    choice: dict[str, Any]
    if request.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role_only else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    if finish_reason is not None:
        choice["stop_reason"] = None
    chunk: dict[str, Any] = {"id": response_id, "object": obj, "created": created, "model": request.model}
    chunk["choices"] = [choice]
    if usage is not None:
        chunk["usage"] = _usage(*usage)
    return b"data: " + _dumps(chunk) + b"\n\n"


def sse_usage_chunk(request: ParsedRequest, response_id: str, created: int, completion_tokens: int) -> bytes:
    """The final ``choices: []`` chunk with ``usage`` (``stream_options.include_usage``)."""
    obj = "chat.completion.chunk" if request.kind == "chat" else "text_completion"
    chunk = {
        "id": response_id,
        "object": obj,
        "created": created,
        "model": request.model,
        "choices": [],
        "usage": _usage(request.prompt_tokens, completion_tokens),
    }
    return b"data: " + _dumps(chunk) + b"\n\n"


def sse_error(status: int, message: str) -> bytes:
    """A mid-stream error event (vLLM sends it, then ``[DONE]``)."""
    return b"data: " + _dumps(error_body(status, message)) + b"\n\n"


def sse_done() -> bytes:
    """The stream terminator."""
    return b"data: [DONE]\n\n"
