"""What the demo runs: its options, the scenario it replays, and the files it writes for every child.

Wall clock versus emulated clock: the emulated instances run ``time_scale`` wall seconds per emulated second
and report emulated seconds in their vLLM metrics, but the router and the controller measure wall time. So
that every part compares like with like, the demo gives the router and the controller a copy of the policy
file whose millisecond values (SLOs, queue-wait bounds) are multiplied by ``time_scale``, and scales the
controller's interval, window and cooldown the same way. With ``time_scale = 1`` (the default) the files are
used as they are. The load generator and the report divide measured durations by ``time_scale``, so every
number the demo prints is in emulated seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from env.scenario import Scenario, ScenarioError, load_scenario
from env.workloads.config import StepWorkload
from pdctl.scrape_config import render_scrape_config
from policies.policy_file import PolicyFileError, load_policy_file, resolve_policy

__all__ = [
    "CHAMPION_SPEC",
    "DEFAULT_POLICY_FILE",
    "DEFAULT_SCENARIO",
    "FALLBACK_POLICY_SPEC",
    "DemoInputError",
    "DemoOptions",
    "RequestSloBounds",
    "controller_config",
    "prometheus_config",
    "rescale_scenario",
    "router_config",
    "scaled_policy_document",
    "tenant_slos",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SCENARIO = REPO_ROOT / "experiments" / "scenarios" / "demo-rag-surge-8.yaml"
DEFAULT_POLICY_FILE = Path(__file__).resolve().parent / "demo-policy.yaml"
CHAMPION_SPEC = "registry:models:/pdctl-generalist@champion"
FALLBACK_POLICY_SPEC = "learned:default"
ADMIN_TOKEN_ENV = "PDCTL_ADMIN_TOKEN"


class DemoInputError(ValueError):
    """Bad input to the demo (one line, printed before anything starts)."""


@dataclass(frozen=True, slots=True)
class RequestSloBounds:
    """A tenant's per-request TTFT/TPOT bounds in emulated seconds (``None`` = no objective).

    The bounds a single request is scored against, derived from the tenant's quantile objectives
    (:class:`policies.schema.Slo`) by :func:`tenant_slos`.
    """

    ttft_s: float | None
    tpot_s: float | None


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """Everything ``pdctl demo`` was asked for."""

    scenario_path: Path = DEFAULT_SCENARIO
    policy: str | None = None
    """Policy spec for the controlled phase; ``None`` = the registered champion if any, else the rule policy."""
    policy_file: Path = DEFAULT_POLICY_FILE
    duration_s: float | None = None
    """Emulated seconds of load per phase (default: the scenario's ``duration_s``)."""
    time_scale: float = 1.0
    seed: int | None = None
    baseline: bool = True
    out_dir: Path = Path("runs") / "demo"
    live: bool | None = None
    """Rich live dashboard (``None`` = when stdout is a terminal)."""
    prometheus: bool | None = None
    """Use a real Prometheus (``None`` = when ``prometheus`` is on the PATH)."""
    controller_interval_s: float = 2.0
    """Emulated seconds between control ticks (scaled to wall seconds by ``time_scale``)."""
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        """Refuse bad values with one line."""
        if not math.isfinite(self.time_scale) or not 0.05 <= self.time_scale <= 10.0:
            raise DemoInputError(f"--time-scale must be within [0.05, 10], not {self.time_scale}")
        if self.duration_s is not None and (not math.isfinite(self.duration_s) or not 10 <= self.duration_s <= 3600):
            raise DemoInputError(f"--duration must be within [10, 3600] seconds, not {self.duration_s}")
        if self.seed is not None and self.seed < 0:
            raise DemoInputError(f"--seed must be >= 0, not {self.seed}")
        if not self.scenario_path.is_file():
            raise DemoInputError(f"--scenario {self.scenario_path}: no such file")


def load_demo_scenario(options: DemoOptions) -> Scenario:
    """The scenario, rescaled to ``--duration`` and checked for what the demo needs."""
    try:
        scenario = load_scenario(options.scenario_path)
    except ScenarioError as exc:
        raise DemoInputError(str(exc).splitlines()[0]) from None
    if len(scenario.tenant_groups) != 1:
        raise DemoInputError(f"--scenario {options.scenario_path}: the demo runs one tenant group, not "
                             f"{len(scenario.tenant_groups)}")  # fmt: skip
    group = scenario.tenant_groups[0]
    if group.aggregated or group.prefill < 1:
        raise DemoInputError(f"--scenario {options.scenario_path}: needs prefill >= 1 and no aggregated instances")
    if options.duration_s is not None:
        scenario = rescale_scenario(scenario, options.duration_s)
    if options.seed is not None:
        scenario = scenario.model_copy(update={"seed": options.seed})
    return scenario


def rescale_scenario(scenario: Scenario, duration_s: float) -> Scenario:
    """``scenario`` over ``duration_s``; step segments keep their place relative to the run (surge stays mid-run)."""
    factor = duration_s / scenario.duration_s
    tenants = []
    for tenant in scenario.tenants:
        workload = tenant.workload
        if isinstance(workload, StepWorkload):
            segments = tuple(s.model_copy(update={"start_s": s.start_s * factor}) for s in workload.segments)
            workload = workload.model_copy(update={"segments": segments})
        tenants.append(tenant.model_copy(update={"workload": workload}))
    return scenario.model_copy(update={"duration_s": duration_s, "tenants": tenants})


def scenario_document(scenario: Scenario) -> dict[str, Any]:
    """``scenario`` as a YAML-ready mapping (what the load generator child reads)."""
    data: dict[str, Any] = scenario.model_dump(mode="json", exclude_none=True)
    return data


def _scale_ms(node: Any, factor: float) -> Any:
    if isinstance(node, dict):
        return {
            k: (v * factor if isinstance(k, str) and k.endswith("_ms") and isinstance(v, int | float) else
                _scale_ms(v, factor))
            for k, v in node.items()
        }  # fmt: skip
    if isinstance(node, list):
        return [_scale_ms(v, factor) for v in node]
    return node


def scaled_policy_document(policy_file: Path, time_scale: float) -> dict[str, Any]:
    """The policy file with every ``*_ms`` value multiplied by ``time_scale`` (validated by the shared loader)."""
    try:
        resolve_policy(load_policy_file(policy_file), str(policy_file))
        data = yaml.safe_load(policy_file.read_text(encoding="utf-8"))
    except (PolicyFileError, OSError, yaml.YAMLError) as exc:
        raise DemoInputError(f"policy file {policy_file}: {str(exc).splitlines()[0]}") from None
    scaled: dict[str, Any] = _scale_ms(data, time_scale) if time_scale != 1.0 else data
    return scaled


def tenant_slos(scenario: Scenario, policy_file: Path) -> dict[str, RequestSloBounds]:
    """Per scenario tenant, the per-request bounds the controller works to (the policy file's, else the scenario's).

    A request meets an objective when its TTFT (TPOT) is at most the tightest quantile objective set
    (:meth:`policies.schema.Slo.ttft_target_s`), the project's definition of SLO attainment.
    """
    try:
        resolved = resolve_policy(load_policy_file(policy_file), str(policy_file))
    except PolicyFileError as exc:
        raise DemoInputError(f"policy file {policy_file}: {str(exc).splitlines()[0]}") from None
    out: dict[str, RequestSloBounds] = {}
    for tenant in scenario.tenants:
        policy = resolved.tenants.get(tenant.name)
        slo = policy.tenant.slo if policy is not None else tenant.slo.to_slo()
        ttft, tpot = slo.ttft_target_s(), slo.tpot_target_s()
        out[tenant.name] = RequestSloBounds(
            ttft if math.isfinite(ttft) else None, tpot if math.isfinite(tpot) else None
        )
    return out


def instance_roles(scenario: Scenario) -> dict[str, str]:
    """Initial instance ids and roles, as the emulator names them (``p0..`` prefill, ``d0..`` decode)."""
    group = scenario.tenant_groups[0]
    roles = {f"p{k}": "prefill" for k in range(group.prefill)}
    roles.update({f"d{k}": "decode" for k in range(group.decode)})
    return roles


def router_config(
    port: int, urls: Mapping[str, str], roles: Mapping[str, str], policy_path: Path, request_log: Path, token: str,
    scenario: Scenario,
) -> dict[str, Any]:  # fmt: skip
    """The router's configuration for the emulated instances."""
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "policy_file": str(policy_path),
        "admin_token": token,
        "request_log": str(request_log),
        "instances": [
            {
                "id": iid,
                "url": urls[iid],
                "role": roles[iid],
                "max_num_seqs": scenario.cluster.max_num_seqs,
                "max_num_batched_tokens": scenario.cluster.max_num_batched_tokens,
            }
            for iid in roles
        ],
        "health": {"interval_s": 1.0, "timeout_s": 1.0, "metrics_poll_s": 2.0},
    }


def prometheus_config(
    router_url: str, urls: Mapping[str, str], group: str, scrape_interval_s: float = 1.0
) -> dict[str, Any]:
    """The shipped scrape configuration (``deploy/prometheus/prometheus.yml``) with the demo's targets, every second."""
    instances = {iid: (url, group) for iid, url in urls.items()}
    return render_scrape_config(router_url, instances, scrape_interval_s)


def controller_config(
    *,
    mode: str,
    policy: str,
    policy_path: Path,
    port: int,
    router_url: str,
    token: str,
    urls: Mapping[str, str],
    roles: Mapping[str, str],
    group: str,
    audit_log: Path,
    override_dir: Path,
    prometheus_url: str | None,
    time_scale: float,
    interval_s: float,
) -> dict[str, Any]:
    """The controller's configuration (all durations in wall seconds)."""
    wall_interval_s = max(0.5, interval_s * time_scale)
    window_s = max(4.0, 3.0 * wall_interval_s)
    source: dict[str, Any]
    if prometheus_url is not None:
        source = {"kind": "prometheus", "url": prometheus_url, "window_s": window_s, "timeout_s": 2.0}
    else:
        source = {"kind": "scrape", "router_metrics_url": f"{router_url}/metrics", "window_s": window_s,
                  "timeout_s": 2.0}  # fmt: skip
    return {
        "mode": mode,
        "interval_s": wall_interval_s,
        "policy": policy,
        "policy_file": str(policy_path),
        "override_dir": str(override_dir),
        "audit_log": str(audit_log),
        "lease_file": str(audit_log.parent / "controller.lease"),
        "control_memory_file": str(audit_log.parent / "controller.memory.json"),  # removed at each run's start
        "listen": {"host": "127.0.0.1", "port": port},
        "source": source,
        "instances": [{"id": iid, "group": group, "role": roles[iid], "url": urls[iid]} for iid in roles],
        "actuators": [{"kind": "router", "url": router_url, "token": token, "timeout_s": 3.0}],
        "guard": {
            "max_step_per_tick": 1,
            "cooldown_s": wall_interval_s,
            "hysteresis_ticks": 2,
            "max_staleness_s": max(3.0, 2.5 * wall_interval_s),
        },
        "rules": {"prefill_queue_wait_high_s": 0.5 * time_scale},
    }
