"""Per-request routing: tenant, token estimates, placement, live state, then the shared route decision.

The placement rules and the route decision are :mod:`policies.placement` and :func:`policies.routing.decide_route`
(one copy each for the simulator and the router); this module is the router's adapter: it gathers their inputs
from the router's own view of its instances (:class:`router.registry.Instance` satisfies
:class:`policies.placement.InstanceView`):

1. tenant = ``ResolvedPolicy.identify_tenant(X-Tenant-Id header, API key, model)``;
2. input tokens (see :mod:`router.estimates`) and expected output tokens
   (:func:`policies.placement.expected_output_tokens`: ``max_completion_tokens`` / ``max_tokens`` of the request,
   else the tenant's ``expected_output_tokens``, else the configured default);
3. decode instance (:func:`policies.placement.choose_decode`) over the decode instances taking requests, with the
   prefix-hit estimate of :class:`router.estimates.PrefixTracker`;
4. prefill instance (:func:`policies.placement.choose_prefill`) over the prefill instances taking requests;
5. :class:`policies.schema.LiveState` (:func:`policies.placement.build_live_state`) with the prefill instance's
   measured rate, the transfer-path health and the number of prefill instances taking requests;
6. the route decision (:func:`policies.routing.decide_route`), then the admission stage when configured
   (:mod:`policies.admission`): the local queue it reads is the decode instance's
   ``awaiting_first_token_tokens``, the rate the prefill instance's measured one (else the configured initial
   rate). A refused plan places nothing and counts nothing as incoming.

A remote plan counts as ``incoming`` on its decode instance until its decode leg starts (:meth:`Planner.plan`
adds it, :meth:`Planner.decode_leg_started` removes it), so placement sees the requests still prefilling.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.admission import AdmissionConfig, admits, estimated_ttft_s
from policies.placement import (
    PlacementConfig,
    PrefillRate,
    build_live_state,
    choose_decode,
    choose_prefill,
    expected_output_tokens,
    usable_prefix_hit_tokens,
)
from policies.policy_file import ResolvedPolicy
from policies.routing import decide_route
from policies.schema import LiveState, RequestFeatures, RouteDecision, RouteReason, RoutingThresholds
from router.config import EstimationConfig
from router.estimates import PrefixTracker, TransferHealth, prefix_blocks
from router.registry import Instance, InstanceRegistry
from router.rollback import Rollback

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
    live: LiveState
    refused: bool = False
    """The admission stage refused the request (:mod:`policies.admission`): answer 429, call nothing."""


class Planner:
    """Builds a :class:`Plan` per request from the policy and the router's live view."""

    def __init__(
        self,
        registry: InstanceRegistry,
        estimation: EstimationConfig,
        health: TransferHealth,
        admission: AdmissionConfig | None = None,
    ) -> None:
        self.registry = registry
        self.admission = admission or AdmissionConfig()
        self.estimation = estimation
        self.transfer_health = health
        self.placement = PlacementConfig(
            affinity_slack_requests=estimation.affinity_slack_requests,
            default_output_tokens=estimation.default_output_tokens,
            initial_prefill_tokens_per_s=estimation.prefill_tokens_per_s,
        )
        self.prefix: dict[str, PrefixTracker] = {}
        self.rollback = Rollback()
        """The operator's rollback (``/admin/rollback``), applied on top of the policy in force."""
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
            rate = self.prefill_rate[inst.id] = self.placement.new_prefill_rate()
        return rate

    def estimate_input_tokens(self, text: str) -> int:
        """Prompt tokens from characters (see :mod:`router.estimates`)."""
        return math.ceil(len(text) / self.estimation.chars_per_token)

    def choose_decode(self, blocks: list[int], exclude: frozenset[str] = frozenset()) -> tuple[Instance, int] | None:
        """Decode instance and its prefix-hit blocks (:func:`policies.placement.choose_decode`), or None."""
        candidates = [i for i in self.registry.serving("decode") if i.id not in exclude]
        block_tokens = self.estimation.prefix_block_tokens

        def hit_tokens(inst: Instance) -> int:
            return self.tracker(inst).hit_blocks(blocks) * block_tokens if blocks else 0

        chosen = choose_decode(candidates, hit_tokens, self.placement.affinity_slack_requests)
        if chosen is None:
            return None
        return chosen[0], chosen[1] // block_tokens

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
        """Decide one request; None when no decode instance takes requests.

        A remote plan counts as incoming on its decode instance: call :meth:`decode_leg_started` once its
        prefill leg is over (whatever its outcome).
        """
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
        hit_tokens = usable_prefix_hit_tokens(hit_blocks * self.estimation.prefix_block_tokens, input_tokens)
        tenant_policy = policy.tenants.get(tenant)
        expected = expected_output_tokens(
            _requested_output(body),
            tenant_policy.expected_output_tokens if tenant_policy else None,
            self.placement.default_output_tokens,
        )
        features = RequestFeatures(request_id, tenant, input_tokens, expected, model)
        thresholds = self.rollback.apply(tenant, policy.thresholds_for(tenant))
        serving_prefill = self.registry.serving("prefill")
        prefill = choose_prefill(serving_prefill)
        live = build_live_state(
            decode,
            hit_tokens,
            prefill,
            None if prefill is None else self.rate(prefill),
            len(serving_prefill),
            self.transfer_health.allows_remote(now_s),
        )
        decision = decide_route(features, thresholds, live)
        if self.admission.enabled and tenant_policy is not None:
            rate = (
                self.rate(prefill).tokens_per_s if prefill is not None else self.placement.initial_prefill_tokens_per_s
            )
            estimate = estimated_ttft_s(
                decision, live, input_tokens - hit_tokens, decode.awaiting_first_token_tokens, rate
            )
            if not admits(self.admission, tenant_policy.tenant.slo.ttft_target_s(), estimate):
                refused = RouteDecision(decision.route, RouteReason.ADMISSION_REFUSED)
                return Plan(features, thresholds, refused, decode, None, blocks, hit_tokens, live, refused=True)
        remote_prefill = prefill if decision.is_remote else None
        if remote_prefill is not None:
            decode.incoming += 1
            self.transfer_health.sent_remote(now_s)
        return Plan(features, thresholds, decision, decode, remote_prefill, blocks, hit_tokens, live)

    @staticmethod
    def decode_leg_started(plan: Plan) -> None:
        """The prefill leg of a remote plan is over: its decode instance stops counting it as incoming."""
        if plan.prefill is not None:
            plan.decode.incoming -= 1
