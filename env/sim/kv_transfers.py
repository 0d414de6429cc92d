"""KV transfers in the simulator: prefill completions, transfers over links, timeouts, failures, fallbacks.

Bytes = (prompt − tokens the decode instance already caches) × KV bytes per token of the whole model, over the
prefill instance's link (:mod:`env.sim.transfer`), with setup latency and, between different TP degrees, layout
(pack and unpack) time. On failure (probability ``failure_prob``) or timeout the tenant's
``on_kv_transfer_timeout`` applies: local re-prefill on the decode instance, or one retry on another prefill
instance first (``retry_remote_prefill``). Network incidents change every link's rate mid-flight. Every outcome
is recorded in the group's KV-transfer breaker (:class:`policies.transfer_health.TransferBreaker`, the router's
judgment), which the next arrivals' route decisions read.
"""

from __future__ import annotations

import math

from env.scenario import NetworkConfig
from env.sim.base import (
    EVENT_LINK,
    EVENT_TRANSFER_READY,
    EVENT_TRANSFER_START,
    EVENT_TRANSFER_TIMEOUT,
    SimulatorBase,
)
from env.sim.engine import EngineRequest
from env.sim.instances import GroupState, InstanceState, SimInstance
from env.sim.placement import prefill_view
from env.sim.records import SimRequest
from env.sim.transfer import Link, Transfer
from policies.placement import choose_prefill
from policies.schema import FallbackAction, RouteReason

__all__ = ["KvTransfers"]


class KvTransfers(SimulatorBase):
    """The simulator's part that moves KV caches from prefill to decode instances."""

    def _prefill_done(self, prefill: SimInstance, er: EngineRequest) -> None:
        request: SimRequest = er.tag
        prefill.assigned_requests -= 1
        prefill.assigned_prefill_tokens -= er.prompt_tokens
        if request.prefill_alone and prefill.prefill_rate is not None:
            prefill.prefill_rate.observe(er.prompt_tokens, self.now_s - request.prefill_sent_s)
        if math.isnan(request.queue_wait_s):
            request.queue_wait_s = er.first_scheduled_s - request.arrival_s
        request.prefill_compute_s += er.prefill_done_s - er.first_scheduled_s
        decode = self.instances[request.decode_instance]
        decode.in_transfer += 1
        cached = decode.engine.prefix_hit_tokens(request.hash_ids, er.hash_block_tokens, er.prompt_tokens)
        size = float((er.prompt_tokens - cached) * self.kv_bytes_per_token)
        layout = size * self._layout_s_per_byte
        net = self._net
        fails = net.failure_prob > 0 and float(self.rng.random()) < net.failure_prob
        xfer = Transfer(request, er, prefill, decode, prefill.link, size, self.now_s, layout, layout, fails)
        request.pack_s = layout
        request.transfer_bytes += size
        self.num_transfers += 1
        # The timeout event is armed only when the transfer could miss its deadline (see _reschedule_link).
        xfer.deadline_s = self.now_s + net.timeout_s
        delay = net.setup_latency_s + layout
        if delay + layout >= net.timeout_s:
            self._arm_timeout(xfer)
        if delay > 0:
            self._push(self.now_s + delay, EVENT_TRANSFER_START, xfer, 0)
        else:
            self._transfer_flow(xfer)

    def _transfer_flow(self, xfer: Transfer) -> None:
        if xfer.state != Transfer.PENDING:
            return
        link = xfer.link
        link.add(xfer, self.now_s)
        self._reschedule_link(link)

    def _arm_timeout(self, xfer: Transfer) -> None:
        xfer.armed = True
        self._push(xfer.deadline_s, EVENT_TRANSFER_TIMEOUT, xfer, 0)

    def _reschedule_link(self, link: Link) -> None:
        link.version += 1
        flows = link.flows
        if flows:
            self._push(link.next_completion_s(), EVENT_LINK, link, link.version)
            # Shares change only here, so a flow whose projected end (plus unpack) passes its deadline is found
            # here, before the deadline: arm its timeout then.
            per_byte_s = len(flows) / link.bandwidth_bytes_per_s
            start = link.last_update_s
            for flow in flows:
                if (
                    not flow.armed
                    and start + max(flow.remaining_bytes, 0.0) * per_byte_s + flow.unpack_s > flow.deadline_s
                ):
                    self._arm_timeout(flow)

    def _link_event(self, link: Link) -> None:
        for xfer in link.pop_finished(self.now_s):
            if xfer.unpack_s > 0:
                xfer.state = Transfer.UNPACKING
                self._push(self.now_s + xfer.unpack_s, EVENT_TRANSFER_READY, xfer, 0)
            else:
                self._transfer_ready(xfer)
        self._reschedule_link(link)

    def _network_change(self, net: NetworkConfig) -> None:
        """Switch to ``net``'s settings now: links change rate mid-flight; new transfers use its failure and setup."""
        self._net = net
        bandwidth = net.link_bandwidth_bytes_per_s
        for inst in self.instances:
            link = inst.link
            if link.bandwidth_bytes_per_s != bandwidth:
                link.set_bandwidth(bandwidth, self.now_s)
                self._reschedule_link(link)

    def _transfer_ready(self, xfer: Transfer) -> None:
        if xfer.state == Transfer.ABANDONED:
            return
        xfer.state = Transfer.DONE
        request: SimRequest = xfer.request
        elapsed = self.now_s - xfer.start_s
        request.transfer_s += self.now_s - xfer.start_s - xfer.pack_s - xfer.unpack_s
        request.unpack_s = xfer.unpack_s
        group = self.groups[xfer.prefill.group]
        if xfer.fails:
            self._transfer_failed(xfer, group)
            return
        self._log_transfer(group, elapsed, False)
        self.transfer_bytes += xfer.bytes_total
        self.xfer_time_hist.observe(elapsed)
        self.xfer_bytes_hist.observe(xfer.bytes_total)
        self._release_prefill(xfer)
        decode: SimInstance = xfer.decode
        decode.incoming -= 1
        decode.in_transfer -= 1
        request.kv_ready_s = self.now_s
        er: EngineRequest = xfer.engine_request
        ready = EngineRequest(
            request.request_id,
            er.prompt_tokens,
            request.output_tokens,
            request.hash_ids,
            er.hash_block_tokens,
            kv_ready=True,
            tag=request,
        )
        decode.engine.add_request(ready, self.now_s)
        self._kick(decode)

    def _transfer_timeout(self, xfer: Transfer) -> None:
        if xfer.state in (Transfer.DONE, Transfer.ABANDONED):
            return
        if xfer.state == Transfer.FLOWING:
            xfer.link.remove(xfer, self.now_s)
            self._reschedule_link(xfer.link)
        request: SimRequest = xfer.request
        request.transfer_s += self.now_s - xfer.start_s
        self._transfer_failed(xfer, self.groups[xfer.prefill.group])

    def _log_transfer(self, group: GroupState, elapsed_s: float, failed: bool) -> None:
        group.transfer_log.append((self.now_s, elapsed_s, failed))
        group.breaker.record(self.now_s, not failed)

    def _release_prefill(self, xfer: Transfer) -> None:
        prefill: SimInstance = xfer.prefill
        prefill.engine.release(xfer.engine_request.request_id)
        if prefill.state == InstanceState.DRAINING and not prefill.busy:
            self._maybe_drained(prefill)

    def _transfer_failed(self, xfer: Transfer, group: GroupState) -> None:
        xfer.state = Transfer.ABANDONED
        request: SimRequest = xfer.request
        request.transfer_failures += 1
        self.transfer_failures += 1
        self._log_transfer(group, self.now_s - xfer.start_s, True)
        self._release_prefill(xfer)
        decode: SimInstance = xfer.decode
        decode.in_transfer -= 1
        action = self.thresholds[request.tenant].on_kv_transfer_timeout
        if action == FallbackAction.RETRY_REMOTE_PREFILL and not request.retried:
            others = [p for p in self.groups[decode.group].prefill if p is not xfer.prefill]
            if others:
                request.retried = True
                target = choose_prefill([prefill_view(p) for p in others])
                assert target is not None
                block = xfer.engine_request.hash_block_tokens
                er = EngineRequest(
                    request.request_id, request.input_tokens, 1, request.hash_ids, block, prefill_only=True, tag=request
                )
                self._send_prefill(target.instance, request, er)
                return
        decode.incoming -= 1
        request.remote = False
        request.reason = RouteReason.FALLBACK_TRANSFER_FAILED
        request.fallback_s = self.now_s
        local = EngineRequest(
            request.request_id, request.input_tokens, request.output_tokens, request.hash_ids,
            xfer.engine_request.hash_block_tokens, tag=request,
        )  # fmt: skip
        decode.engine.add_request(local, self.now_s)
        self._kick(decode)
        if decode.state == InstanceState.DRAINING:
            self._maybe_drained(decode)
