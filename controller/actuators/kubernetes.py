"""The Kubernetes actuator: replica counts through the ``scale`` subresource of Deployments/StatefulSets.

Speaks the API server's REST protocol directly over aiohttp (the ``kubernetes`` package is an optional
extra): ``GET`` and ``PATCH`` (``application/merge-patch+json``, body ``{"spec": {"replicas": N}}``) on
``/apis/apps/v1/namespaces/{namespace}/{deployments|statefulsets}/{name}/scale`` with a bearer token.
Replicas asked for but not yet ready (``spec.replicas`` above ``status.replicas``) are reported as pending.
A token file (the pod's projected service-account token, which the kubelet rotates) is re-read whenever it
changes.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp

from controller.actuators.base import ActuationResult, Outcome, Plan, UnknownOutcomeLatch
from controller.actuators.http import call
from controller.sources.base import Topology
from policies.pool_clamp import within_bounds
from policies.schema import PoolTargets, TenantGroup

__all__ = ["KubernetesActuator", "Workload", "scale_path"]

_PLURAL = {"Deployment": "deployments", "StatefulSet": "statefulsets"}


@dataclass(frozen=True, slots=True)
class Workload:
    """A Deployment or StatefulSet."""

    kind: str
    name: str


def scale_path(namespace: str, workload: Workload) -> str:
    """API path of a workload's ``scale`` subresource."""
    return f"/apis/apps/v1/namespaces/{namespace}/{_PLURAL[workload.kind]}/{workload.name}/scale"


class KubernetesActuator:
    """Sets prefill/decode replica counts per tenant group."""

    def __init__(
        self,
        api_url: str,
        namespace: str,
        token: str | None,
        groups: Mapping[str, tuple[Workload, Workload]],
        timeout_s: float,
        ca_file: Path | None = None,
        insecure_skip_tls_verify: bool = False,
        token_file: Path | None = None,
        bounds: Sequence[TenantGroup] = (),
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.bounds = {g.name: g for g in bounds}
        self.namespace = namespace
        self.groups = dict(groups)
        self._token = token
        self._token_file = token_file if token is None else None
        self._token_mtime_ns: int | None = None
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._ssl: ssl.SSLContext | bool = True
        if insecure_skip_tls_verify:
            self._ssl = False
        elif ca_file is not None:
            self._ssl = ssl.create_default_context(cafile=str(ca_file))
        self._session: aiohttp.ClientSession | None = None
        self.latch = UnknownOutcomeLatch()

    @property
    def name(self) -> str:
        """``kubernetes``."""
        return "kubernetes"

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=aiohttp.TCPConnector(ssl=self._ssl))
        return self._session

    def _url(self, workload: Workload) -> str:
        return self.api_url + scale_path(self.namespace, workload)

    @property
    def _headers(self) -> dict[str, str]:
        if self._token_file is not None:
            try:
                mtime_ns = self._token_file.stat().st_mtime_ns
                if mtime_ns != self._token_mtime_ns:
                    self._token = self._token_file.read_text(encoding="utf-8").strip()
                    self._token_mtime_ns = mtime_ns
            except OSError:
                pass  # keep the last token read; the API server answers 401 if it expired
        headers = {"Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    async def _replicas(self, workload: Workload) -> tuple[int, int] | None:
        reply = await call(self._http(), "GET", self._url(workload), headers=self._headers)
        if reply.outcome is not Outcome.APPLIED or not isinstance(reply.body, dict):
            return None
        spec = reply.body.get("spec", {}).get("replicas", 0)
        status = reply.body.get("status", {}).get("replicas", spec)
        if not isinstance(spec, int) or not isinstance(status, int):
            return None
        return spec, status

    async def observe(self, topology: Topology) -> Topology | None:
        """Pool counts (``spec.replicas``) and pending replicas of every configured group."""
        pools = dict(topology.pools)
        pending = dict(topology.pending)
        for group, (prefill, decode) in self.groups.items():
            read_prefill, read_decode = await self._replicas(prefill), await self._replicas(decode)
            if read_prefill is None or read_decode is None:
                return None
            pools[group] = PoolTargets(read_prefill[0], read_decode[0])
            pending[group] = (max(read_prefill[0] - read_prefill[1], 0), max(read_decode[0] - read_decode[1], 0))
        self.latch.clear()
        # Kubernetes adds instances: a group it scales is bounded by its budget, not by the instances listed now.
        capacity = {g: n for g, n in topology.capacity.items() if g not in self.groups}
        return replace(topology, pools=pools, pending=pending, capacity=capacity)

    async def apply(self, plan: Plan, topology: Topology) -> ActuationResult:
        """Patch the replicas of every workload whose count changes; stop at the first failure."""
        if self.latch.set:
            return self.latch.held(self.name)
        done: list[str] = []
        for group, target in sorted(plan.pools.items()):
            workloads = self.groups.get(group)
            if workloads is None:
                continue
            bounds = self.bounds.get(group)
            if bounds is not None:  # whatever the plan says, never outside the group's bounds and budget
                target = within_bounds(target, bounds)
            current = topology.pools.get(group)
            for workload, replicas, before in (
                (workloads[0], target.num_prefill, None if current is None else current.num_prefill),
                (workloads[1], target.num_decode, None if current is None else current.num_decode),
            ):
                if replicas == before:
                    continue
                reply = await call(
                    self._http(),
                    "PATCH",
                    self._url(workload),
                    body={"spec": {"replicas": replicas}},
                    headers=self._headers,
                    content_type="application/merge-patch+json",
                )
                if reply.outcome is not Outcome.APPLIED:
                    if reply.outcome is Outcome.UNKNOWN:
                        self.latch.trip(reply.detail)
                    return ActuationResult(self.name, reply.outcome, "; ".join([*done, reply.detail]))
                done.append(f"{workload.kind}/{workload.name} replicas={replicas}")
        if not done:
            return ActuationResult(self.name, Outcome.UNCHANGED, "nothing to change")
        return ActuationResult(self.name, Outcome.APPLIED, "; ".join(done))

    async def ready(self) -> bool:
        """Whether every configured workload's scale can be read."""
        for prefill, decode in self.groups.values():
            if await self._replicas(prefill) is None or await self._replicas(decode) is None:
                return False
        return True

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
