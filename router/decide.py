"""Per-request routing: tenant, token estimates, instance choice, live state, then the shared route decision.

The decision itself is :func:`policies.routing.decide_route` (one copy for the simulator and the router); this
module only gathers its inputs:

1. tenant = ``ResolvedPolicy.identify_tenant(X-Tenant-Id header, API key, model)``;
2. input tokens (see :mod:`router.estimates`) and expected output tokens (``max_completion_tokens`` /
   ``max_tokens`` of the request, else the tenant's ``expected_output_tokens``, else the configured default);
3. decode instance: among decode instances taking requests, the one with the longest estimated prefix hit
   whose in-flight count is within ``affinity_slack_requests`` of the least-loaded one (least loaded first);
4. prefill instance: the one with the fewest prompt tokens in flight;
5. :class:`policies.schema.LiveState`: that prefill instance's queue wait estimate, requests and tokens; the
   decode instance's pressure ``max(in-flight / max_num_seqs, KV usage when polled)`` and prefix hit; the
   transfer-path health; the number of prefill instances taking requests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.policy_file import ResolvedPolicy
from policies.routing import decide_route
from policies.schema import LiveState, RequestFeatures, RouteDecision, RoutingThresholds
from router.config import EstimationConfig
from router.estimates import PrefillRate, PrefixTracker, TransferHealth, prefix_blocks
from router.registry import Instance, InstanceRegistry

__all__ = ["Plan", "Planner", "prompt_text_of"]


def prompt_text_of(body: Mapping[str, Any]) -> str:
    """The prompt text a request carries (chat messages joined with role markers)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(f"<|{message.get('role', '')}|>{content or ''}\n")
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):  # token ids: one "character" per id keeps the count exact under chars_per_token
        return " " * int(len(prompt) * 4)
    return ""


def _requested_output(body: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything decided for one request before any upstream call."""

    features: RequestFeatures
    thresholds: RoutingThresholds
    decision: RouteDecision
    decode: Instance
    prefill: Instance | None
    blocks: list[int]
    prefix_hit_tokens: int


class Planner:
    """Builds a :class:`Plan` per request from the policy and the router's live view."""

    def __init__(self, registry: InstanceRegistry, estimation: EstimationConfig, health: TransferHealth) -> None:
        self.registry = registry
        self.estimation = estimation
        self.transfer_health = health
        self.prefix: dict[str, PrefixTracker] = {}
        self.prefill_rate: dict[str, PrefillRate] = {}
        self._block_chars = max(round(estimation.prefix_block_tokens * estimation.chars_per_token), 1)

    def tracker(self, inst: Instance) -> PrefixTracker:
        """The prefix tracker of a decode instance."""
        tracker = self.prefix.get(inst.id)
        if tracker is None:
            tracker = self.prefix[inst.id] = PrefixTracker(self.estimation.prefix_blocks_per_instance)
        return tracker

    def rate(self, inst: Instance) -> PrefillRate:
        """The prefill throughput estimate of an instance."""
        rate = self.prefill_rate.get(inst.id)
        if rate is None:
            rate = self.prefill_rate[inst.id] = PrefillRate(self.estimation.prefill_tokens_per_s)
        return rate

    def estimate_input_tokens(self, text: str) -> int:
        """Prompt tokens from characters (see :mod:`router.estimates`)."""
        return math.ceil(len(text) / self.estimation.chars_per_token)

    def choose_decode(self, blocks: list[int], exclude: frozenset[str] = frozenset()) -> tuple[Instance, int] | None:
        """Decode instance and its prefix-hit blocks (see the module docstring), or None if none serves."""
        candidates = [i for i in self.registry.serving("decode") if i.id not in exclude]
        if not candidates:
            return None
        least = min(i.in_flight for i in candidates)
        bound = least + self.estimation.affinity_slack_requests
        best: Instance | None = None
        best_key = (-1, 0, 0)
        for inst in candidates:
            if inst.in_flight > bound:
                continue
            hit = self.tracker(inst).hit_blocks(blocks) if blocks else 0
            key = (hit, -inst.in_flight, -inst._order)
            if key > best_key:
                best, best_key = inst, key
        assert best is not None
        return best, best_key[0]

    def plan(
        self,
        body: Mapping[str, Any],
        policy: ResolvedPolicy,
        request_id: str,
        tenant_header: str | None,
        api_key: str | None,
        now_s: float,
        input_tokens: int | None = None,
    ) -> Plan | None:
        """Decide one request; None when no decode instance takes requests."""
        model = str(body.get("model") or "")
        tenant = policy.identify_tenant(tenant_header, api_key, model)
        text = prompt_text_of(body)
        if input_tokens is None:
            input_tokens = self.estimate_input_tokens(text)
        blocks = prefix_blocks(text, self._block_chars)
        chosen = self.choose_decode(blocks)
        if chosen is None:
            return None
        decode, hit_blocks = chosen
        hit_tokens = min(hit_blocks * self.estimation.prefix_block_tokens, input_tokens)
        tenant_policy = policy.tenants.get(tenant)
        expected = _requested_output(body)
        if expected is None:
            expected = (tenant_policy.expected_output_tokens if tenant_policy else None) or (
                self.estimation.default_output_tokens
            )
        features = RequestFeatures(request_id, tenant, input_tokens, expected, model)
        thresholds = policy.thresholds_for(tenant)
        prefill = self.registry.least_loaded_prefill()
        pressure = decode.in_flight / decode.max_num_seqs
        if decode.kv_usage_frac is not None:
            pressure = max(pressure, decode.kv_usage_frac)
        live = LiveState(
            prefill_queue_wait_s=None
            if prefill is None
            else self.rate(prefill).wait_s(prefill.in_flight_prefill_tokens),
            decode_pressure_frac=min(pressure, 1.0),
            prefix_hit_tokens=hit_tokens,
            kv_transfer_healthy=self.transfer_health.healthy(now_s),
            num_prefill_instances=len(self.registry.serving("prefill")),
            prefill_queue_requests=None if prefill is None else prefill.in_flight,
            prefill_active_tokens=None if prefill is None else float(prefill.in_flight_prefill_tokens),
            prefill_max_batched_tokens=None if prefill is None else prefill.max_num_batched_tokens,
            decode_kv_usage_frac=decode.kv_usage_frac,
        )
        decision = decide_route(features, thresholds, live)
        return Plan(features, thresholds, decision, decode, prefill if decision.is_remote else None, blocks, hit_tokens)
