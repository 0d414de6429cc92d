from __future__ import annotations

import json

import pytest

from livestack.emulator.protocol import ApiError, parse_request, sse_chunk, sse_done, sse_error, sse_usage_chunk
from livestack.emulator.tokenizer import (
    CHARS_PER_TOKEN,
    OutputText,
    count_tokens,
    generated_text,
    prompt_text,
    token_ids,
)

MODEL = "m"


def parse(body: object, kind: str = "completion", max_model_len: int = 4096):  # type: ignore[no-untyped-def]
    return parse_request(kind, json.dumps(body).encode(), MODEL, max_model_len)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("body", "status", "param", "fragment"),
    [
        ({"model": "other", "prompt": "x"}, 404, "model", "The model `other` does not exist."),
        ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "at least 1"),
        ({"prompt": "x", "max_tokens": "3"}, 400, "max_tokens", "integer"),
        ({"max_tokens": 3}, 400, "prompt", "prompt"),
        ({"prompt": "x" * 16000, "max_tokens": 200}, 400, None, "maximum context length is 4096 tokens"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options", "stream=True"),
        ({"prompt": "x", "kv_transfer_params": [1]}, 400, "kv_transfer_params", "object"),
    ],
)
def test_invalid_requests_are_refused_like_vllm(body: object, status: int, param: str | None, fragment: str) -> None:
    with pytest.raises(ApiError) as info:
        parse(body)
    assert info.value.status == status
    assert info.value.param == param
    assert fragment in info.value.message


def test_chat_requires_messages_and_bad_json_is_400() -> None:
    with pytest.raises(ApiError, match="messages"):
        parse({"messages": []}, kind="chat")
    with pytest.raises(ApiError, match="JSON decode error"):
        parse_request("completion", b"{nope", MODEL, 100)


def test_defaults_and_flags() -> None:
    req = parse({"prompt": "abcdefgh"})
    assert (req.prompt_tokens, req.max_tokens, req.stream) == (2, 16, False)  # vLLM's default max_tokens is 16
    chat = parse({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5, "stream": True}, "chat")
    assert chat.max_tokens == 5
    assert chat.echo_max_completion_tokens
    tokens = parse({"prompt": [1, 2, 3, 4, 5]})
    assert tokens.prompt_tokens == 5
    assert parse({"prompt": "x", "kv_transfer_params": {"do_remote_decode": True}}).do_remote_decode
    assert parse({"prompt": "x", "kv_transfer_params": {"do_remote_prefill": True}}).do_remote_prefill


def test_sse_chunks_follow_vllm_shapes() -> None:
    req = parse({"prompt": "x", "stream": True, "stream_options": {"include_usage": True}})
    mid = json.loads(sse_chunk(req, "cmpl-1", 7, "ab ", None)[len(b"data: ") :])
    assert mid == {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 7,
        "model": MODEL,
        "choices": [{"index": 0, "text": "ab ", "logprobs": None, "finish_reason": None}],
    }
    last = json.loads(sse_chunk(req, "cmpl-1", 7, "cd ", "length")[len(b"data: ") :])
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["choices"][0]["stop_reason"] is None
    usage = json.loads(sse_usage_chunk(req, "cmpl-1", 7, 2)[len(b"data: ") :])
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    chat = parse({"messages": [{"role": "user", "content": "hi"}], "stream": True}, "chat")
    role = json.loads(sse_chunk(chat, "chatcmpl-1", 7, "", None, role_only=True)[len(b"data: ") :])
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    error = sse_error(500, "boom")
    assert json.loads(error[len(b"data: ") :]) == {
        "error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}
    }
    assert sse_done() == b"data: [DONE]\n\n"
    for raw in (error, sse_done()):
        assert raw.startswith(b"data: ")
        assert raw.endswith(b"\n\n")


def test_tokenizer_is_deterministic_and_prompts_have_exact_lengths() -> None:
    assert count_tokens("") == 0
    assert count_tokens("abcd") == 1
    assert count_tokens("abcde") == 2
    assert token_ids("abcdabcd") == token_ids("abcd") * 2
    for n in (1, 7, 511, 512, 513, 3000):
        assert count_tokens(prompt_text(n, (4, 5), 512, salt="r")) == n
    shared_a = prompt_text(1500, (1, 2, 3), 512, salt="a")
    shared_b = prompt_text(1500, (1, 2, 9), 512, salt="b")
    block_chars = 512 * CHARS_PER_TOKEN
    assert shared_a[: 2 * block_chars] == shared_b[: 2 * block_chars]
    assert shared_a[2 * block_chars :] != shared_b[2 * block_chars :]
    assert prompt_text(100, salt="x") != prompt_text(100, salt="y")
    assert prompt_text(100, salt="x") == prompt_text(100, salt="x")
    out = OutputText("a prompt")
    words = [out.next() for _ in range(50)]
    assert all(count_tokens(w) == 1 for w in words)
    assert "".join(words) == generated_text("a prompt", 50)
    assert generated_text("a prompt", 50) != generated_text("another prompt", 50)
    assert len(set(words)) > 10


def test_output_continues_a_prompt_extended_by_its_own_output() -> None:
    """Greedy-like: the prompt plus the first k output tokens continues with output token k (migration relies on it)."""
    prompt = prompt_text(300, salt="c")
    full = generated_text(prompt, 40)
    for k in (0, 1, 17, 39):
        head = full[: k * CHARS_PER_TOKEN]
        assert head + generated_text(prompt + head, 40 - k) == full


def test_chat_continue_final_message_renders_the_open_assistant_turn() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    prompt = parse({"messages": messages, "max_tokens": 5}, "chat").prompt
    cont = parse(
        {
            "messages": [*messages, {"role": "assistant", "content": "kalo "}],
            "add_generation_prompt": False,
            "continue_final_message": True,
            "max_tokens": 4,
        },
        "chat",
    )
    assert cont.prompt == prompt + "kalo "
    assert cont.prompt_tokens == count_tokens(prompt) + 1  # one more token, whatever the prompt length
    with pytest.raises(ApiError) as info:
        parse({"messages": messages, "continue_final_message": True}, "chat")
    assert info.value.param == "continue_final_message"
    with pytest.raises(ApiError):
        parse({"messages": messages, "add_generation_prompt": "no"}, "chat")
