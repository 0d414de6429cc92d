"""Build an emulated instance's engine and KV-transfer model from a scenario's cluster settings.

The engine is :class:`env.sim.engine.InstanceEngine` over the calibrated :mod:`env.perf` step-time model, the
same objects the simulator steps; only the clock differs.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from env.perf import InterpolatedExecutionTimeModel, OperatorProfile, StepOverheads, load_operator_profile
from env.scenario import ClusterConfig, NetworkConfig
from env.sim.engine import EngineConfig, InstanceEngine
from env.sim.instances import kv_capacity_tokens as sim_kv_capacity_tokens

__all__ = ["TransferModel", "build_engine", "kv_capacity_tokens", "load_profile"]


@lru_cache(maxsize=8)
def load_profile(name: str, directory: str | None = None, model_config: str | None = None) -> OperatorProfile:
    """The operator profile ``name`` (cached per process)."""
    return load_operator_profile(name, directory, model_config=model_config)


@lru_cache(maxsize=8)
def _time_model(
    name: str, directory: str | None, config: str | None, tp: int, step_overhead_s: float | None, max_batch: int
) -> InterpolatedExecutionTimeModel:
    overheads = StepOverheads() if step_overhead_s is None else StepOverheads(step_overhead_s=step_overhead_s)
    return InterpolatedExecutionTimeModel(load_profile(name, directory, config), tp, overheads, max_batch=max_batch)


def kv_capacity_tokens(cluster: ClusterConfig, tp: int) -> int:
    """KV tokens one instance holds (the cluster's override, else the simulator's memory formula)."""
    if cluster.kv_capacity_tokens is not None:
        return cluster.kv_capacity_tokens
    profile = load_profile(cluster.profile, _dir(cluster.profile_dir), _dir(cluster.hf_config))
    return sim_kv_capacity_tokens(profile, tp, cluster.gpu_memory_utilization, cluster.activation_reserve_bytes)


def _dir(path: Path | None) -> str | None:
    return None if path is None else str(path)


def build_engine(cluster: ClusterConfig, tp: int | None = None) -> InstanceEngine:
    """A fresh engine for one instance of ``cluster`` (TP ``tp``, default the cluster's)."""
    degree = tp or cluster.tp
    model = _time_model(
        cluster.profile,
        _dir(cluster.profile_dir),
        _dir(cluster.hf_config),
        degree,
        cluster.step_overhead_s,
        cluster.max_num_seqs,
    )
    config = EngineConfig(
        kv_capacity_tokens=kv_capacity_tokens(cluster, degree),
        max_num_seqs=cluster.max_num_seqs,
        max_num_batched_tokens=cluster.max_num_batched_tokens,
        enable_prefix_caching=cluster.enable_prefix_caching,
    )
    return InstanceEngine(config, model)


class TransferModel:
    """Duration of one KV pull (emulated seconds), following the scenario's network settings.

    ``setup_latency_s + bytes / link_bandwidth``, plus pack and unpack at the layout-conversion rate when the
    prefill and decode TP degrees differ. Unlike the simulator, an emulated decode instance cannot see the other
    pulls sharing the prefill instance's link (they may run in other processes), so the link is not shared.

    Network incidents (``network.incidents``) apply over the emulator's own clock (emulated seconds since the
    instance started, :meth:`livestack.emulator.driver.EngineDriver.emulated_now_s`) when a pull passes its start time:
    the setup latency in effect when the pull starts, and the link rate of each period the bytes cross. Transfer
    failures come from the instance's :class:`~livestack.emulator.faults.FaultConfig`, not from the network's
    ``failure_prob`` (base or incident), which only the simulator draws.
    """

    def __init__(self, network: NetworkConfig, kv_bytes_per_token: int, tp: int) -> None:
        self.network = network
        self.kv_bytes_per_token = kv_bytes_per_token
        self.tp = tp
        self._changes = network.changes()

    def num_bytes(self, num_tokens: int) -> int:
        """Bytes of KV for ``num_tokens`` tokens."""
        return max(num_tokens, 0) * self.kv_bytes_per_token

    def setup_latency_s(self, start_s: float | None = None) -> float:
        """The setup latency of a pull starting at ``start_s`` (emulated seconds; None: the base setting)."""
        net = self.network if start_s is None else self.network.at(start_s)
        return net.setup_latency_s

    def layout_s(self, num_tokens: int, remote_tp: int | None = None) -> float:
        """Seconds of one layout conversion (the pack before the flow, and again the unpack after it).

        Zero when the prefill instance's TP degree ``remote_tp`` is this instance's (no conversion).
        """
        if num_tokens <= 0 or remote_tp is None or remote_tp == self.tp:
            return 0.0
        return self.num_bytes(num_tokens) / self.network.layout_bandwidth_bytes_per_s

    def duration_s(self, num_tokens: int, remote_tp: int | None = None, start_s: float | None = None) -> float:
        """Seconds to pull ``num_tokens`` tokens from a prefill instance of TP ``remote_tp``.

        Args:
            num_tokens: tokens of KV pulled.
            remote_tp: the prefill instance's TP degree (default: this instance's, no layout conversion).
            start_s: when the pull starts, in emulated seconds; None ignores incidents (the base settings).
        """
        if num_tokens <= 0:
            return 0.0
        net = self.network
        size = self.num_bytes(num_tokens)
        layout_s = self.layout_s(num_tokens, remote_tp)
        if start_s is None or not self._changes:
            seconds = net.setup_latency_s + size / net.link_bandwidth_bytes_per_s
            return seconds + 2 * layout_s if layout_s else seconds
        flow_start_s = start_s + net.at(start_s).setup_latency_s + layout_s
        return self._flow_end_s(flow_start_s, float(size)) + layout_s - start_s

    def _flow_end_s(self, t_s: float, size: float) -> float:
        """When ``size`` bytes started at ``t_s`` are sent, at the link rate of each period they cross."""
        rate = self.network.at(t_s).link_bandwidth_bytes_per_s
        remaining = size
        for change_s, settings in self._changes:
            if change_s <= t_s:
                continue
            capacity = (change_s - t_s) * rate
            if capacity >= remaining:
                break
            remaining -= capacity
            t_s = change_s
            rate = settings.link_bandwidth_bytes_per_s
        return t_s + remaining / rate

    @classmethod
    def for_cluster(cls, cluster: ClusterConfig, tp: int | None = None) -> TransferModel:
        """The transfer model of ``cluster``'s network and model."""
        degree = tp or cluster.tp
        profile = load_profile(cluster.profile, _dir(cluster.profile_dir), _dir(cluster.hf_config))
        return cls(cluster.network, profile.model.kv_bytes_per_token(degree), degree)
