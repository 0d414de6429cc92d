"""Fuzz the live router on loopback: request parsing (``/v1/completions``, ``/v1/chat/completions``) and the
admin API, with hypothesis-generated bodies and headers (the router has no OpenAPI spec, so no schemathesis).

Every request is answered within a bound, never with a 5xx: either 200 (a stream that ends with ``[DONE]``) or
a 4xx with the documented JSON error (``{"error": {"message": ...}}``). A refused admin call (400, or 409 for a
stale generation) changes nothing
(generation, policy, roles); a call without the right token is 401. Secrets (the admin token, clients' API keys)
never appear in the request log, the router's log output, ``/metrics`` or ``/admin/state``.

One emulated cluster + router serves a whole module, in a background thread with its own event loop (hypothesis
drives plain functions). The fast variants run in the default suite; ``slow`` ones run many more examples.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.router.cluster import ADMIN_TOKEN, LiveCluster, live_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
T = TypeVar("T")
BOUND_S = 20.0
API_KEY = "sk-fuzz-client-secret-7f3a9c"
POLICY = """
pd_disaggregation_policy:
  remote_prefill: {min_input_tokens: 300, min_expected_output_tokens: 1, require_decode_pool_pressure: false}
  local_prefill: {max_input_tokens: 200}
tenants:
  - name: chat
    match: {tenant_ids: [chat]}
"""


class Served:
    """A live cluster running on its own event loop in a background thread."""

    def __init__(self, tmp: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz-cluster", daemon=True)
        self.thread.start()
        self.stack = contextlib.AsyncExitStack()
        self.cluster: LiveCluster = self.run(
            self.stack.enter_async_context(live_cluster(tmp, 1, 1, policy_yaml=POLICY, time_scale=0.05))
        )

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = BOUND_S) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        try:
            self.run(self.stack.aclose())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()

    async def _call(
        self, method: str, path: str, data: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes, str]:
        c = self.cluster
        payload = io.BytesIO(data) if data is not None and len(data) > 1024**2 else data  # large: no loop lock
        async with c.session.request(method, c.url + path, data=payload, headers=headers) as resp:
            return resp.status, await resp.read(), resp.headers.get("Content-Type", "")

    def call(self, method: str, path: str, data: bytes | None = None, **headers: str) -> tuple[int, bytes, str]:
        return self.run(self._call(method, path, data, {"Content-Type": "application/json", **headers}))

    def admin(self, method: str, path: str, body: Any = None, token: str = ADMIN_TOKEN) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        status, raw, _ = self.call(method, path, data, Authorization=f"Bearer {token}")
        return status, json.loads(raw) if raw else None

    def state(self) -> dict[str, Any]:
        status, body = self.admin("GET", "/admin/state")
        assert status == 200
        return dict(body)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = Served(tmp_path_factory.mktemp("fuzz-router"))
    try:
        yield s
    finally:
        s.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=15,
)
small_scalars = st.none() | st.booleans() | st.integers(-3, 12) | st.floats(-1e3, 1e3) | st.text(max_size=8)
messages = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "role": st.sampled_from(["user", "system", "assistant", "tool", ""]) | small_scalars,
            "content": st.text(max_size=300) | small_scalars | st.lists(json_values, max_size=2),
        },
    ),
    max_size=3,
)
completion_bodies = st.fixed_dictionaries(
    {},
    optional={
        "prompt": st.text(max_size=2000) | st.lists(st.integers(-5, 50000), max_size=20) | small_scalars,
        "messages": messages | small_scalars,
        "max_tokens": st.integers(-3, 12) | small_scalars,
        "stream": st.booleans() | small_scalars,
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": small_scalars}) | small_scalars,
        "model": st.text(max_size=20) | small_scalars,
        "temperature": small_scalars,
        "n": small_scalars,
        "kv_transfer_params": json_values,
    },
)
valid_ish_bodies = st.fixed_dictionaries(
    {
        "prompt": st.text(max_size=3000),
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=1500)}),
            min_size=1,
            max_size=3,
        ),
        "max_tokens": st.integers(1, 8),
    },
    optional={
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "temperature": st.floats(0, 2),
        "kv_transfer_params": json_values,
        "unknown_field": json_values,
    },
)
"""Requests a client could plausibly send (prompt and messages both set: the endpoint picks its own), other
fields fuzzed: these reach the instances and must stream to ``[DONE]``."""
header_text = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40)
request_headers = st.fixed_dictionaries(
    {},
    optional={
        "X-Request-Id": header_text,
        "X-Tenant-Id": st.sampled_from(["chat", "nobody", ""]) | header_text,
        "Authorization": st.just(f"Bearer {API_KEY}") | header_text,
    },
)


def _check_generation(served: Served, path: str, data: bytes, headers: dict[str, str]) -> None:
    status, raw, content_type = served.call("POST", path, data, **headers)
    event(f"HTTP {status}")
    assert status < 500, (status, raw[:300])
    if status == 200:
        if content_type.startswith("text/event-stream"):
            assert raw.rstrip().endswith(b"data: [DONE]"), raw[-200:]
        else:
            assert json.loads(raw)["choices"] is not None
    else:
        error = json.loads(raw)["error"]
        assert isinstance(error["message"], str)
        assert error["message"]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=completion_bodies | valid_ish_bodies, headers=request_headers, chat=st.booleans())
def test_generation_bodies(served: Served, body: dict[str, Any], headers: dict[str, str], chat: bool) -> None:
    if isinstance(body.get("max_tokens"), int) and not isinstance(body["max_tokens"], bool):
        body["max_tokens"] = min(body["max_tokens"], 12)  # keep every stream short (bounded load)
    else:
        body.pop("max_tokens", None)
        body["max_tokens"] = 4
    path = "/v1/chat/completions" if chat else "/v1/completions"
    _check_generation(served, path, json.dumps(body).encode(), headers)


@settings(max_examples=80, deadline=None)
@given(raw=st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_raw_bodies(served: Served, raw: bytes) -> None:
    with contextlib.suppress(ValueError):
        doc = json.loads(raw)
        if isinstance(doc, dict) and ("prompt" in doc or "messages" in doc):
            return  # only malformed or non-request bodies here (a real request with no max_tokens could run long)
    _check_generation(served, "/v1/completions", raw, {})


policy_bodies = st.fixed_dictionaries(
    {},
    optional={
        "generation": small_scalars,
        "policy": json_values
        | st.fixed_dictionaries(
            {},
            optional={
                "pd_disaggregation_policy": json_values,
                "tenants": json_values | st.lists(st.fixed_dictionaries({"name": small_scalars}), max_size=2),
                "tenant_groups": json_values,
                "routes": json_values,
            },
        ),
        "extra": small_scalars,
    },
)
role_bodies = st.fixed_dictionaries(
    {},
    optional={
        "roles": json_values
        | st.dictionaries(
            st.sampled_from(["p0", "d0", "x"]) | st.text(max_size=4),
            st.sampled_from(["prefill", "decode", "verifier"]) | small_scalars,
            max_size=3,
        )
    },
)


def _comparable(state: dict[str, Any]) -> Any:
    return state["generation"], state["policy"], [(i["id"], i["role"], i["pending_role"]) for i in state["instances"]]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=policy_bodies | json_values, roles=st.booleans())
def test_admin_bodies_are_applied_or_refused_and_change_nothing(served: Served, body: Any, roles: bool) -> None:
    if roles:
        body = body if not isinstance(body, dict) or "policy" not in body else {"roles": body["policy"]}
    path = "/admin/roles" if roles else "/admin/policy"
    before = served.state()
    status, answer = served.admin("PUT", path, body)
    event(f"{path} HTTP {status}")
    assert status in (200, 400, 409), (status, answer)
    if status in (400, 409):  # 409: a generation not newer than the router's (compare-and-set)
        assert answer["error"]["message"]
        assert isinstance(answer["error"]["field"], str)
        assert _comparable(served.state()) == _comparable(before)
    if roles and status == 200:  # put the roles back so later examples start from one prefill + one decode
        assert served.admin("PUT", "/admin/roles", {"roles": {"p0": "prefill", "d0": "decode"}})[0] == 200


@settings(max_examples=40, deadline=None)
@given(depth=st.integers(65, 20_000), open_close=st.sampled_from([("[", "]"), ('{"a":', "}")]), admin=st.booleans())
def test_deep_nesting_is_a_json_400_on_both_apis(
    served: Served, depth: int, open_close: tuple[str, str], admin: bool
) -> None:
    opening, closing = open_close
    raw = (opening * depth + ("1" if opening != "[" else "") + closing * depth).encode()
    before = served.state()
    path, method = ("/admin/policy", "PUT") if admin else ("/v1/completions", "POST")
    status, answer, _ = served.call(method, path, raw, Authorization=f"Bearer {ADMIN_TOKEN}")
    assert status == 400, (status, answer[:200])
    assert "nested too deeply" in json.loads(answer)["error"]["message"]
    assert _comparable(served.state()) == _comparable(before)


def test_oversized_bodies_are_a_json_413_on_both_apis(served: Served) -> None:
    before = served.state()
    data_limit, admin_limit = 16 * 1024**2, 1024**2  # router/config.py LimitsConfig defaults
    for method, path, size in (("POST", "/v1/completions", data_limit + 1), ("PUT", "/admin/policy", admin_limit + 1)):
        raw = b'{"prompt": "' + b"x" * (size - 14) + b'"}'
        status, answer, content_type = served.call(method, path, raw, Authorization=f"Bearer {ADMIN_TOKEN}")
        assert status == 413, (path, status)
        assert content_type.startswith("application/json")
        assert "exceeds the limit" in json.loads(answer)["error"]["message"]
    assert _comparable(served.state()) == _comparable(before)


@settings(max_examples=60, deadline=None)
@given(body=role_bodies)
def test_role_bodies(served: Served, body: Any) -> None:
    before = served.state()
    status, answer = served.admin("PUT", "/admin/roles", body)
    assert status in (200, 400), (status, answer)
    if status == 400:
        assert answer["error"]["field"].startswith(("roles", "<body>"))
        assert _comparable(served.state()) == _comparable(before)
    else:
        assert served.admin("PUT", "/admin/roles", {"roles": {"p0": "prefill", "d0": "decode"}})[0] == 200


@settings(max_examples=60, deadline=None)
@given(token=st.text(max_size=40).filter(lambda t: t.strip() != ADMIN_TOKEN), method_path=st.sampled_from(
    [("GET", "/admin/state"), ("PUT", "/admin/policy"), ("PUT", "/admin/roles")]))  # fmt: skip
def test_admin_needs_its_token(served: Served, token: str, method_path: tuple[str, str]) -> None:
    before = served.state()
    method, path = method_path
    headers = {}
    with contextlib.suppress(UnicodeEncodeError):
        token.encode("latin-1")
        if all(0x20 <= ord(ch) < 0x7F for ch in token):
            headers["Authorization"] = f"Bearer {token}"
    status, raw, _ = served.call(method, path, b'{"policy": {}, "roles": {"d0": "decode"}}', **headers)
    assert status == 401, (status, raw)
    assert json.loads(raw)["error"]["field"] == "Authorization"
    assert _comparable(served.state()) == _comparable(before)
    # a near miss (case, prefix, whitespace inside) is refused too
    for near in (ADMIN_TOKEN.upper(), ADMIN_TOKEN[:-1], ADMIN_TOKEN + "x", f"{ADMIN_TOKEN[:4]} {ADMIN_TOKEN[4:]}"):
        assert served.call("GET", "/admin/state", None, Authorization=f"Bearer {near}")[0] == 401


def test_secrets_never_logged(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    c = served.cluster
    for k in range(6):
        body = {"prompt": "word " * (60 if k % 2 else 400), "max_tokens": 3, "stream": k % 3 != 0}
        status, _, _ = served.call(
            "POST", "/v1/completions", json.dumps(body).encode(), Authorization=f"Bearer {API_KEY}", **{
                "X-Tenant-Id": "chat", "X-Request-Id": f"secret-{k}"}
        )  # fmt: skip
        assert status == 200
    served.admin("PUT", "/admin/policy", {"policy": {"tenants": "bad"}})  # a refused admin call
    served.call("GET", "/admin/state", None, Authorization=f"Bearer {ADMIN_TOKEN}x")  # a wrong token
    assert c.router.log is not None
    served.run(asyncio.to_thread(c.router.log.flush))
    status, metrics, _ = served.call("GET", "/metrics")
    assert status == 200
    state = json.dumps(served.state())
    logged = c.log_path.read_text()
    assert "secret-5" in logged  # the request log was written
    for secret in (API_KEY, ADMIN_TOKEN):
        assert secret not in logged
        assert secret not in caplog.text
        assert secret not in metrics.decode()
        assert secret not in state


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=completion_bodies | valid_ish_bodies, headers=request_headers, chat=st.booleans())
def test_generation_bodies_long(served: Served, body: dict[str, Any], headers: dict[str, str], chat: bool) -> None:
    test_generation_bodies.hypothesis.inner_test(served, body, headers, chat)  # type: ignore[attr-defined]


def test_upstream_session_is_closed_cleanly(served: Served) -> None:
    assert isinstance(served.cluster.session, aiohttp.ClientSession)
    assert not served.cluster.session.closed
