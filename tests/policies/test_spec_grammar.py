"""The one policy-spec grammar (policies.registry): watchdog wrapping, registered kinds; route levels."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from policies import registry
from policies.base import Policy
from policies.learned import LearnedPolicy
from policies.policy_file import PolicyFile, resolve_policy
from policies.registry import (
    WATCHDOG_FALLBACK,
    LoadOptions,
    PolicySpec,
    PolicySpecError,
    build_policy,
    fixed_layout,
    load_policy,
    parse_policy_spec,
    register_kind,
)
from policies.route_levels import RouteLevelError, level_min_remote_tokens, remote_level, route_thresholds
from policies.routing import decide_route
from policies.rules import FilePolicy, QueueKvPolicy
from policies.schema import LiveState, RequestFeatures, Route, RouteRule
from policies.watchdog import SloWatchdog
from tests.policies.test_learned import LAYOUT, write_artifact

BASE = resolve_policy(PolicyFile())


def test_watchdog_specs_wrap_the_primary_with_the_named_or_default_fallback(tmp_path: Path) -> None:
    watched = load_policy("watchdog:baseline:queue_kv", BASE)
    assert isinstance(watched, SloWatchdog)
    assert isinstance(watched.primary, QueueKvPolicy)
    assert watched.fallback.policy_id == WATCHDOG_FALLBACK
    (tmp_path / "f.yaml").write_text("pd_disaggregation_policy: {remote_prefill: {min_input_tokens: 3000}}\n")
    named = load_policy("watchdog[file:f.yaml]:baseline:vllm-proxy", BASE, base_dir=tmp_path)
    assert isinstance(named, SloWatchdog)
    assert isinstance(named.fallback, FilePolicy)
    assert named.fallback.thresholds_for("anyone").min_remote_input_tokens == 3000
    assert named.policy_id == "watchdog[file:f.yaml]:baseline:vllm-proxy"
    assert str(parse_policy_spec("watchdog:learned:/a")) == f"watchdog[{WATCHDOG_FALLBACK}]:learned:/a"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("watchdog", "expected watchdog:PRIMARY or watchdog[FALLBACK]:PRIMARY"),
        ("watchdog:watchdog:baseline:aggregated", "the watchdog's primary must be"),
        ("watchdog[learned:x]:baseline:aggregated", "the watchdog's fallback must be baseline:NAME or file:PATH"),
        ("watchdog:registry:pdctl", "registry:models:/NAME@ALIAS"),
    ],
)
def test_bad_watchdog_specs_name_the_spec(spec: str, message: str) -> None:
    with pytest.raises(PolicySpecError, match=f"^{re.escape(f'policy spec {spec!r}: ')}") as info:
        parse_policy_spec(spec)
    assert message in str(info.value)


def test_registered_kinds_join_the_grammar_and_get_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_REGISTERED", dict(registry._REGISTERED))  # leave the grammar as it was
    seen: list[tuple[PolicySpec, object]] = []

    def factory(spec: PolicySpec, options: LoadOptions) -> Policy:
        seen.append((spec, options.extra))
        if spec.argument == "bad":
            raise ValueError("not today")
        return build_policy("baseline:vllm-proxy", options)

    with pytest.raises(PolicySpecError, match="expected one of"):
        parse_policy_spec("probe-kind:x")
    register_kind("probe_kind", factory, "probe_kind:X")
    register_kind("probe_empty", factory, "probe_empty:", empty_argument=True)
    policy = build_policy("probe_kind:x", LoadOptions(BASE, extra="scenario"))
    assert policy.policy_id == "baseline:vllm-proxy"
    assert seen == [(PolicySpec("probe_kind", "x"), "scenario")]
    assert parse_policy_spec("probe_empty:") == PolicySpec("probe_empty", "")
    with pytest.raises(PolicySpecError, match=r"expected one of .*probe_kind:X"):
        parse_policy_spec("probe_kind:")
    with pytest.raises(PolicySpecError, match=r"^policy spec 'probe_kind:bad': not today$"):
        build_policy("probe_kind:bad", LoadOptions(BASE))
    with pytest.raises(PolicySpecError, match="the watchdog's primary must be"):
        parse_policy_spec("watchdog:probe_kind:x")  # registered kinds are evaluation-only: never watched
    for reserved in ("file", "watchdog", "not a name"):
        with pytest.raises(ValueError, match="cannot register"):
            register_kind(reserved, factory, "x")


def test_fallback_dir_finds_relative_paths_the_base_dir_lacks(tmp_path: Path) -> None:
    (tmp_path / "f.yaml").write_text("pd_disaggregation_policy: {remote_prefill: {min_input_tokens: 3000}}\n")
    options = LoadOptions(BASE, base_dir=tmp_path / "elsewhere", fallback_dir=tmp_path)
    assert options.path("f.yaml") == tmp_path / "f.yaml"
    assert options.path("g.yaml") == tmp_path / "elsewhere" / "g.yaml"
    assert isinstance(build_policy("file:f.yaml", options), FilePolicy)


def test_fixed_layout_only_for_learned_policies(tmp_path: Path) -> None:
    assert fixed_layout(load_policy("baseline:queue_kv", BASE)) is None
    assert fixed_layout(load_policy("watchdog:baseline:queue_kv", BASE)) is None
    write_artifact(tmp_path / "artifact")
    learned = load_policy(f"learned:{tmp_path / 'artifact'}", BASE)
    assert not isinstance(learned, LearnedPolicy)  # relabelled with its spec
    assert learned.policy_id == f"learned:{tmp_path / 'artifact'}"
    assert fixed_layout(learned) == LAYOUT
    assert fixed_layout(load_policy(f"watchdog:learned:{tmp_path / 'artifact'}", BASE)) == LAYOUT


def test_route_levels_are_crisp() -> None:
    live = LiveState(num_prefill_instances=1)

    def route(level: str, tokens: int, output_tokens: int = 1) -> Route:
        features = RequestFeatures("r", "t", tokens, expected_output_tokens=output_tokens)
        return decide_route(features, route_thresholds(level), live).route

    assert route("remote>=2048", 2047) is Route.LOCAL_PREFILL
    assert route("remote>=2048", 2048) is Route.REMOTE_PREFILL  # a short output does not keep it local
    assert route("always_remote", 1) is Route.REMOTE_PREFILL
    assert route("aggregated", 100_000) is Route.LOCAL_PREFILL
    assert route_thresholds("local") == route_thresholds("aggregated")
    assert route_thresholds("remote").rule is RouteRule.ALWAYS_REMOTE
    assert [level_min_remote_tokens(x) for x in ("aggregated", "always_remote", remote_level(512))] == [None, 0, 512]
    for bad in ("sometimes", "remote>=", "remote>=0", "remote>=1k"):
        with pytest.raises(RouteLevelError, match="unknown route level"):
            route_thresholds(bad)
    with pytest.raises(RouteLevelError, match="T must be >= 1"):
        remote_level(0)


def test_learned_default_is_the_shipped_rule_selector_and_the_watchdog_is_opt_in() -> None:
    """Since the twelfth session ``learned:default`` ships without the SLO watchdog (chosen on validation 72:
    experiments/results/families/safety-layer-choice/); ``watchdog:learned:default`` still wraps it."""
    from policies.registry import DEFAULT_LEARNED_ARTIFACT, expand_alias
    from policies.rule_selector import RuleSelector

    parsed = parse_policy_spec("learned:default")
    assert parsed.kind == "learned"
    assert parsed.argument == str(DEFAULT_LEARNED_ARTIFACT)
    assert expand_alias("baseline:aggregated") == "baseline:aggregated"
    assert (DEFAULT_LEARNED_ARTIFACT / "manifest.json").is_file()
    policy = load_policy("learned:default", BASE)
    assert not isinstance(policy, SloWatchdog)
    assert isinstance(policy.inner, RuleSelector)  # type: ignore[attr-defined]

    watched = load_policy("watchdog:learned:default", BASE)
    assert isinstance(watched, SloWatchdog)
    assert isinstance(watched.primary.inner, RuleSelector)  # type: ignore[attr-defined]
    assert watched.primary.policy_id == f"learned:{DEFAULT_LEARNED_ARTIFACT}"
    assert watched.fallback.policy_id == WATCHDOG_FALLBACK


def test_learned_admission_is_the_selector_fitted_behind_admission() -> None:
    """``learned:admission`` is the default's recipe with every training rollout behind the admission stage."""
    from policies.registry import ADMISSION_LEARNED_ARTIFACT, DEFAULT_LEARNED_ARTIFACT
    from policies.rule_selector import RuleSelector

    parsed = parse_policy_spec("learned:admission")
    assert parsed.kind == "learned"
    assert parsed.argument == str(ADMISSION_LEARNED_ARTIFACT)
    assert ADMISSION_LEARNED_ARTIFACT != DEFAULT_LEARNED_ARTIFACT
    selector = load_policy("learned:admission", BASE).inner  # type: ignore[attr-defined]
    assert isinstance(selector, RuleSelector)
    assert selector.manifest.trained_behind_admission_slack_frac == 1.0
    default = load_policy("learned:default", BASE).inner  # type: ignore[attr-defined]
    assert default.manifest.trained_behind_admission_slack_frac is None
    # it acts as the default does, but for the outcome check of a switch, which shipped for the default after
    # learned:admission was chosen and was never judged behind the admission stage
    assert {**selector.manifest.behaviour(), "trial_check_windows": 6} == default.manifest.behaviour()
    assert selector.manifest.trial_check_windows == 0


def test_fitted_admission_slack_looks_through_wrappers() -> None:
    """The slack a selector was fitted behind is found under relabelling and the watchdog; other policies have none."""
    from policies.registry import fitted_admission_slack

    assert fitted_admission_slack(load_policy("learned:admission", BASE)) == 1.0
    assert fitted_admission_slack(load_policy("watchdog:learned:admission", BASE)) == 1.0
    assert fitted_admission_slack(load_policy("learned:default", BASE)) is None
    assert fitted_admission_slack(load_policy("watchdog:learned:default", BASE)) is None
    assert fitted_admission_slack(load_policy("baseline:dynamo-legacy", BASE)) is None

    class Delegating:  # a wrapper that names what it delegates to as ``inner`` (the controller's registry policy)
        def __init__(self, inner: object) -> None:
            self.inner = inner

    assert fitted_admission_slack(Delegating(Delegating(load_policy("learned:admission", BASE)))) == 1.0  # type: ignore[arg-type]
    assert fitted_admission_slack(Delegating(None)) is None  # type: ignore[arg-type]
