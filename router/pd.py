"""vLLM's NixlConnector two-step protocol (``reference/vllm-interface.md`` §2.1-2.3), as request bodies.

* Prefill leg: a copy of the client body with ``kv_transfer_params = {do_remote_decode: true, ...}``,
  ``stream: false``, no ``stream_options``, ``max_tokens: 1`` (and ``max_completion_tokens: 1`` if the key was
  present), without ``min_tokens`` / ``min_completion_tokens``.
* Decode leg after a prefill: the original client body with ``kv_transfer_params`` replaced by the prefill
  response's top-level ``kv_transfer_params`` **verbatim**; if the prefill returned none, the original body
  without the key (an ordinary aggregated request).
* Local (aggregated) prefill: the original body without ``kv_transfer_params``.

Headers: the same ``X-Request-Id`` on both legs; ``Authorization`` forwarded to both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["decode_body", "forwarded_headers", "local_body", "prefill_body", "prefill_params"]

_PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def prefill_body(body: Mapping[str, Any]) -> bytes:
    """Body of the prefill leg."""
    out = dict(body)
    out["kv_transfer_params"] = dict(_PREFILL_PARAMS)
    out["stream"] = False
    out.pop("stream_options", None)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out.pop("min_tokens", None)
    out.pop("min_completion_tokens", None)
    return _dumps(out)


def prefill_params(response_body: bytes) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` a prefill instance returned (None if absent or not an object)."""
    try:
        data = json.loads(response_body)
    except ValueError:
        return None
    params = data.get("kv_transfer_params") if isinstance(data, dict) else None
    return params if isinstance(params, dict) else None


def decode_body(body: Mapping[str, Any], params: Mapping[str, Any] | None) -> bytes:
    """Body of the decode leg after a prefill leg (``params`` verbatim)."""
    out = dict(body)
    if params is None:
        out.pop("kv_transfer_params", None)
    else:
        out["kv_transfer_params"] = params
    return _dumps(out)


def local_body(body: Mapping[str, Any], raw: bytes) -> bytes:
    """Body of a local (aggregated) request: the client's bytes unchanged unless they carry KV params."""
    if "kv_transfer_params" not in body:
        return raw
    out = dict(body)
    del out["kv_transfer_params"]
    return _dumps(out)


def forwarded_headers(request_id: str, authorization: str | None) -> dict[str, str]:
    """Headers sent to both legs."""
    headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
    if authorization:
        headers["Authorization"] = authorization
    return headers
