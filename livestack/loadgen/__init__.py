"""Load generator: replays a scenario, workload or trace against any OpenAI endpoint and measures TTFT/TPOT/E2E."""

from livestack.loadgen.client import LoadOptions, RequestResult, replay
from livestack.loadgen.report import ClientTenantStats, summarize, write_csv, write_json
from livestack.loadgen.sources import requests_from_scenario, requests_from_workload

__all__ = [
    "ClientTenantStats",
    "LoadOptions",
    "RequestResult",
    "replay",
    "requests_from_scenario",
    "requests_from_workload",
    "summarize",
    "write_csv",
    "write_json",
]
