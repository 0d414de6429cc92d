"""Policy files: the seed's YAML format, extended with tenants, routes, buckets, SLOs and pool bounds.

A policy file is validated as a whole on load; every problem is reported as one line
``FILE:LINE: field.path: message`` and nothing of an invalid file takes effect.

Format (every key optional unless noted; ``*_ms`` keys are milliseconds, converted to seconds on load)::

    version: 1
    description: free text
    mode: disaggregated | aggregated_only      # aggregated_only = one-step rollback, every tenant local
    expires_at: 2026-12-01T00:00:00Z           # overrides: ignored after this instant
    pd_disaggregation_policy:                  # the seed block: defaults for every tenant
      rule: pdctl | aggregated_only | always_remote | llmd_noncached | dynamo_isl_bounding
            | dynamo_isl_or_load | dynamo_legacy   # per-request rule (policies.routing); peers' rules = baselines
      baseline_params: {uncached_ratio_threshold_frac, max_prefill_queue_requests, prefill_busy_factor}
      remote_prefill: {min_input_tokens, max_prefill_queue_wait_ms, min_expected_output_tokens,
                       require_decode_pool_pressure, decode_pressure_threshold_perc}
      local_prefill: {max_input_tokens, prefer_when_prefix_cache_hit}
    fallback: {on_kv_transfer_timeout, on_prefill_queue_overload}
    rollout: {enabled_models, traffic_percent, remote_prefill_when: {input_tokens_gte},
              stream_response, fallback_to_aggregated}
    slo: {ttft_p95_ms, ttft_p99_ms, tpot_p95_ms, tpot_p99_ms}
    tenant_groups:
      - {name (required), gpu_budget (required), gpus_per_instance,
         pools: {prefill: {min, max}, decode: {min, max}}}
    tenants:
      - name (required), group, priority, slo, expected_output_tokens,
        match: {tenant_ids, api_keys, models},
        mode, pd_disaggregation_policy, fallback, rollout,
        prompt_length_buckets: [{min_input_tokens, max_input_tokens, route}]
    routes:                                    # model rules for requests with no tenant id
      - {model: NAME, tenant: NAME}

**Precedence** (most specific wins, field by field): a tenant's prompt-length bucket > the tenant's own
``pd_disaggregation_policy`` / ``fallback`` / ``rollout`` / ``mode`` fields > the file's top-level blocks >
built-in defaults (:class:`policies.schema.RoutingThresholds`). Within one level,
``rollout.remote_prefill_when.input_tokens_gte`` wins over ``remote_prefill.min_input_tokens``.
A request's tenant is, in order: its tenant id (header) if a tenant is named so or lists it in
``match.tenant_ids``; its API key in some tenant's ``match.api_keys``; its model in ``match.models`` or the
first ``routes`` rule naming the model; else the tenant ``default`` (built in when the file has none).

**The gap** between ``local_prefill.max_input_tokens`` and ``remote_prefill.min_input_tokens`` is decided
by decode pressure (see :mod:`policies.routing`, rule 11).
"""

from policies.policy_file.errors import PolicyFileError, PolicyProblem
from policies.policy_file.load import dump_policy_yaml, load_policy_data, load_policy_file, load_policy_text
from policies.policy_file.resolve import ResolvedPolicy, TenantPolicy, resolve_policy
from policies.policy_file.schema import DEFAULT_GROUP, DEFAULT_TENANT, PolicyFile, TenantBlock

__all__ = [
    "DEFAULT_GROUP",
    "DEFAULT_TENANT",
    "PolicyFile",
    "PolicyFileError",
    "PolicyProblem",
    "ResolvedPolicy",
    "TenantBlock",
    "TenantPolicy",
    "dump_policy_yaml",
    "load_policy_data",
    "load_policy_file",
    "load_policy_text",
    "resolve_policy",
]
