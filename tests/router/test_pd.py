from __future__ import annotations

import json

from router.pd import decode_body, forwarded_headers, local_body, prefill_body, prefill_params

CLIENT = {
    "model": "m",
    "prompt": "hello",
    "max_tokens": 200,
    "max_completion_tokens": 200,
    "min_tokens": 10,
    "min_completion_tokens": 10,
    "stream": True,
    "stream_options": {"include_usage": True},
    "temperature": 0.7,
}


def test_prefill_body_follows_the_reference_proxy() -> None:
    body = json.loads(prefill_body(CLIENT))
    assert body == {
        "model": "m",
        "prompt": "hello",
        "max_tokens": 1,
        "max_completion_tokens": 1,
        "stream": False,
        "temperature": 0.7,
        "kv_transfer_params": {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        },
    }
    # max_completion_tokens appears only when the client sent it
    assert "max_completion_tokens" not in json.loads(prefill_body({"prompt": "x", "max_tokens": 5}))
    assert CLIENT["max_tokens"] == 200  # the client body is not modified


def test_decode_body_carries_the_prefill_params_verbatim() -> None:
    params = {"do_remote_prefill": True, "remote_block_ids": [[1, 2]], "remote_engine_id": "e", "x_future": {"a": 1}}
    body = json.loads(decode_body(CLIENT, params))
    assert body["kv_transfer_params"] == params
    assert {k: v for k, v in body.items() if k != "kv_transfer_params"} == CLIENT
    assert "kv_transfer_params" not in json.loads(decode_body({**CLIENT, "kv_transfer_params": {"a": 1}}, None))


def test_local_body_is_the_client_bytes_without_params() -> None:
    raw = json.dumps(CLIENT).encode()
    assert local_body(CLIENT, raw) is raw
    stripped = json.loads(local_body({**CLIENT, "kv_transfer_params": {"do_remote_prefill": True}}, b""))
    assert stripped == CLIENT


def test_prefill_params_and_headers() -> None:
    assert prefill_params(b'{"kv_transfer_params": {"do_remote_prefill": true}}') == {"do_remote_prefill": True}
    assert prefill_params(b'{"kv_transfer_params": null}') is None
    assert prefill_params(b"not json") is None
    assert forwarded_headers("rid", None) == {"Content-Type": "application/json", "X-Request-Id": "rid"}
    assert forwarded_headers("rid", "Bearer k")["Authorization"] == "Bearer k"
