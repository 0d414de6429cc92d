"""Pools in the simulator: instances starting, draining, flipping role and stopping toward pool targets.

:meth:`PoolControl.apply` moves each group toward a policy's targets: surplus instances of one role flip to the
other (drain, then ``role_switch_delay_s``), missing ones start (``startup_delay_s``) within the GPU budget, extra
ones drain and stop. Draining instances take no new requests and finish what they hold (no request is dropped).
"""

from __future__ import annotations

from env.sim.base import EVENT_INSTANCE_READY, SimulatorBase
from env.sim.engine import InstanceEngine
from env.sim.instances import InstanceRole, InstanceState, SimInstance
from env.sim.transfer import Link
from policies.schema import ControlAction

__all__ = ["PoolControl"]


class PoolControl(SimulatorBase):
    """The simulator's part that runs instance lifecycles and pool changes."""

    def _new_instance(self, group_index: int, role: str, ready: bool) -> SimInstance:
        tp = self._prefill_tp if role == InstanceRole.PREFILL else self.scenario.cluster.tp
        engine = InstanceEngine(self._engine_configs[tp], self._models[tp])
        inst = SimInstance(
            len(self.instances), group_index, role, engine, Link(self._net.link_bandwidth_bytes_per_s), tp
        )
        inst.prefill_rate_tokens_per_s = self._prefill_rate(tp)
        inst.prefill_rate = self.placement.new_prefill_rate()
        inst.created_s = self.now_s
        self.instances.append(inst)
        group = self.groups[group_index]
        group.instances.append(inst)
        if ready:
            self._activate(inst)
        else:
            inst.state = InstanceState.STARTING
            inst.ready_s = self.now_s + self.scenario.cluster.startup_delay_s
            self._push(inst.ready_s, EVENT_INSTANCE_READY, inst, 0)
        return inst

    def _prefill_rate(self, tp: int) -> float:
        tokens = self._engine_configs[tp].max_num_batched_tokens
        step = self._models[tp].step_time_s(tokens, 1, 0, 0, [(tokens, 0)])
        return tokens / step

    def _activate(self, inst: SimInstance) -> None:
        inst.state = InstanceState.ACTIVE
        inst.next_role = inst.role
        inst.name = f"{inst.role}-{inst.index}"
        group = self.groups[inst.group]
        (group.prefill if inst.role == InstanceRole.PREFILL else group.decode).append(inst)

    def apply(self, action: ControlAction) -> None:
        """Apply a policy's action: per-tenant thresholds now; pool targets through drains and start-ups."""
        for tenant, thresholds in action.thresholds.items():
            index = self._tenant_index.get(tenant)
            if index is not None:
                self.thresholds[index] = thresholds
        for group_name, targets in action.pools.items():
            for gi, group in enumerate(self.groups):
                if group.name == group_name:
                    self._retarget(gi, targets.num_prefill, targets.num_decode)

    def _future_role(self, inst: SimInstance) -> str | None:
        if inst.state == InstanceState.STOPPED:
            return None
        return inst.next_role

    def _retarget(self, group_index: int, want_prefill: int, want_decode: int) -> None:
        """Move a group toward targets; remembered, and retried when a drained instance frees its GPUs.

        GPUs are counted per instance at its TP degree (prefill instances at ``prefill_tp``). Role flips
        (drain, then restart in the other role) are used only when both roles have the same TP degree.
        """
        group = self.groups[group_index]
        group.targets = (want_prefill, want_decode)
        if group.retargeting:
            return
        group.retargeting = True
        try:
            self._retarget_once(group_index, want_prefill, want_decode)
        finally:
            group.retargeting = False

    def _retarget_once(self, group_index: int, want_prefill: int, want_decode: int) -> None:  # noqa: C901
        group = self.groups[group_index]
        prefill_tp, decode_tp = self._prefill_tp, self.scenario.cluster.tp
        if group.max_prefill is not None:
            want_prefill = min(want_prefill, group.max_prefill)
        if group.max_decode is not None:
            want_decode = min(want_decode, group.max_decode)
        want_prefill = max(want_prefill, group.min_prefill)
        want_decode = max(want_decode, group.min_decode)
        budget = group.gpu_budget
        if want_prefill * prefill_tp + want_decode * decode_tp > budget:
            # over budget (a guard should have clamped it): keep the prefill target, decode gets the rest
            want_prefill = min(want_prefill, max((budget - group.min_decode * decode_tp) // prefill_tp, 0))
            want_decode = (budget - want_prefill * prefill_tp) // decode_tp

        def future(role_is_prefill: bool) -> list[SimInstance]:
            out = []
            for inst in group.instances:
                role = self._future_role(inst)
                if role is not None and (role == InstanceRole.PREFILL) == role_is_prefill:
                    out.append(inst)
            return out

        def by_load(insts: list[SimInstance]) -> list[SimInstance]:
            return sorted(insts, key=lambda i: (i.state != InstanceState.STARTING, i.load(), -i.index))

        delta_prefill = want_prefill - len(future(True))
        delta_decode = want_decode - len(future(False))
        if prefill_tp == decode_tp:
            while delta_prefill > 0 and delta_decode < 0:
                candidates = [i for i in by_load(future(False)) if i.state == InstanceState.ACTIVE]
                if not candidates:
                    break
                self._begin_drain(candidates[0], InstanceRole.PREFILL)
                delta_prefill -= 1
                delta_decode += 1
            while delta_decode > 0 and delta_prefill < 0:
                candidates = [i for i in by_load(future(True)) if i.state == InstanceState.ACTIVE]
                if not candidates:
                    break
                self._begin_drain(candidates[0], InstanceRole.DECODE)
                delta_prefill += 1
                delta_decode -= 1
        # shrink first, so that the GPUs of stopped instances can serve the growth
        for is_prefill, delta in ((True, delta_prefill), (False, delta_decode)):
            for inst in by_load(future(is_prefill))[: max(-delta, 0)]:
                self._begin_drain(inst, None)
        used = sum(i.tp for i in group.instances if i.state != InstanceState.STOPPED)
        while delta_prefill > 0 and used + prefill_tp <= budget:
            self._new_instance(group_index, InstanceRole.PREFILL, ready=False)
            delta_prefill -= 1
            used += prefill_tp
        while delta_decode > 0 and used + decode_tp <= budget:
            self._new_instance(group_index, InstanceRole.DECODE, ready=False)
            delta_decode -= 1
            used += decode_tp

    def _begin_drain(self, inst: SimInstance, next_role: str | None) -> None:
        group = self.groups[inst.group]
        if inst in group.prefill:
            group.prefill.remove(inst)
        if inst in group.decode:
            group.decode.remove(inst)
        inst.next_role = next_role
        if inst.state == InstanceState.STARTING:
            if next_role is None:
                self._stop(inst)
            else:
                inst.role = next_role
            return
        inst.state = InstanceState.DRAINING
        self._maybe_drained(inst)

    def _maybe_drained(self, inst: SimInstance) -> None:
        if inst.state != InstanceState.DRAINING or inst.busy or inst.incoming or not inst.engine.is_empty:
            return
        if inst.next_role is None:
            self._stop(inst)
            return
        tp = self._prefill_tp if inst.next_role == InstanceRole.PREFILL else self.scenario.cluster.tp
        inst.role = inst.next_role
        inst.tp = tp
        inst.engine = InstanceEngine(self._engine_configs[tp], self._models[tp], inst.engine.counters)
        inst.prefill_rate_tokens_per_s = self._prefill_rate(tp)
        inst.state = InstanceState.STARTING
        inst.ready_s = self.now_s + self.scenario.cluster.role_switch_delay_s
        self._push(inst.ready_s, EVENT_INSTANCE_READY, inst, 0)

    def _stop(self, inst: SimInstance) -> None:
        inst.state = InstanceState.STOPPED
        inst.next_role = None
        inst.stopped_s = self.now_s
        group = self.groups[inst.group]
        if group.targets is not None and not group.retargeting:
            self._retarget(inst.group, *group.targets)  # its GPUs may now let a pending start-up happen

    def _instance_ready(self, inst: SimInstance) -> None:
        if inst.state != InstanceState.STARTING:
            return
        self._activate(inst)
        self._kick(inst)
