"""Resuming a cut stream (router/resume.py): whole events only, the continuation request, the rewritten events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.resume import Delivered, StreamTranscript, continuation_body, generation_over, stream_tail


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _text_chunk(text: str, finish: str | None = None, rid: str = "cmpl-a") -> bytes:
    return _event(
        {"id": rid, "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    )


def _chat_chunk(content: str | None, role: bool = False, rid: str = "chatcmpl-a") -> bytes:
    delta = {"role": "assistant", "content": ""} if role else {"content": content}
    return _event({"id": rid, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]})


def test_only_whole_events_pass_and_a_cut_half_event_never_reaches_the_client() -> None:
    t = StreamTranscript()
    a, b = _text_chunk("kalo "), _text_chunk("misa ")
    assert t.feed(a + b[:10]) == a
    assert t.feed(b[10:20]) == b""
    assert t.feed(b[20:]) == b
    assert t.feed(b'data: {"id":') == b""  # the stream is cut here
    delivered = t.resume()
    assert (delivered.text, delivered.tokens, delivered.finished, delivered.role_sent) == (
        "kalo misa ",
        2,
        False,
        False,
    )
    # the half event is dropped; the continuation's events pass whole
    c = _text_chunk("nure ", rid="cmpl-b")
    assert json.loads(t.feed(c)[6:])["id"] == "cmpl-a"
    assert t.delivered().text == "kalo misa nure "


def test_a_continuation_drops_its_role_chunk_and_counts_usage_for_the_whole_stream() -> None:
    t = StreamTranscript()
    t.feed(_chat_chunk(None, role=True) + _chat_chunk("kalo ") + _chat_chunk("misa "))
    delivered = t.resume()
    assert (delivered.tokens, delivered.role_sent) == (2, True)
    usage = {"id": "x", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}
    out = t.feed(_chat_chunk(None, role=True) + _chat_chunk("nure ") + _event(usage) + b"data: [DONE]\n\n")
    events = [e[6:] for e in out.split(b"\n\n") if e]
    assert len(events) == 3  # role chunk dropped
    assert json.loads(events[0])["choices"][0]["delta"] == {"content": "nure "}
    assert json.loads(events[1])["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    assert events[2] == b"[DONE]"


def _delivered(text: str, tokens: int, finished: bool = False) -> Delivered:
    return Delivered(text, tokens, False, finished, {"id": "cmpl-a", "object": "text_completion"}, None)


def test_the_continuation_request_appends_the_streamed_text_and_reduces_the_limits() -> None:
    body = {"prompt": "hello", "max_tokens": 10, "min_tokens": 3, "stream": True, "kv_transfer_params": {"x": 1}}
    cont = json.loads(continuation_body(body, False, _delivered("kalo misa ", 2)) or b"")
    assert cont == {"prompt": "hello" + "kalo misa ", "max_tokens": 8, "min_tokens": 1, "stream": True}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5, "stream": True}
    cont = json.loads(continuation_body(chat, True, _delivered("kalo ", 1)) or b"")
    assert cont["messages"][-1] == {"role": "assistant", "content": "kalo "}
    assert (cont["add_generation_prompt"], cont["continue_final_message"], cont["max_completion_tokens"]) == (
        False,
        True,
        4,
    )
    # a request that already continued a message continues it further
    again = json.loads(continuation_body(cont, True, _delivered("misa ", 1)) or b"")
    assert again["messages"][-1] == {"role": "assistant", "content": "kalo misa "}
    assert len(again["messages"]) == 2


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "x", "n": 2, "max_tokens": 5},
        {"prompt": "x", "echo": True, "max_tokens": 5},
        {"prompt": [1, 2, 3], "max_tokens": 5},
    ],
)
def test_requests_that_cannot_be_resumed(body: dict[str, Any]) -> None:
    assert continuation_body(body, False, _delivered("kalo ", 1)) is None


def test_a_stream_cut_after_its_last_token_gets_only_its_tail() -> None:
    body = {"prompt": "x", "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
    assert generation_over(body, _delivered("kalo misa ", 2))
    assert generation_over({"prompt": "x"}, _delivered("kalo ", 1, finished=True))
    assert not generation_over(body, _delivered("kalo ", 1))
    tail = stream_tail(body, _delivered("kalo misa ", 2), prompt_tokens=7)
    usage_event, done = (e for e in tail.split(b"\n\n") if e)
    assert json.loads(usage_event[6:]) == {
        "id": "cmpl-a",
        "object": "text_completion",
        "choices": [],
        "usage": {"prompt_tokens": 7, "total_tokens": 9, "completion_tokens": 2},
    }
    assert done == b"data: [DONE]"


def test_an_error_event_is_reported_not_counted_as_text() -> None:
    t = StreamTranscript()
    error = {"error": {"message": "engine died", "type": "InternalServerError", "param": None, "code": 500}}
    t.feed(_text_chunk("kalo ") + _event(error) + b"data: [DONE]\n\n")
    delivered = t.delivered()
    assert (delivered.text, delivered.tokens, delivered.error) == ("kalo ", 1, "engine died")
    assert StreamTranscript().delivered().error is None
