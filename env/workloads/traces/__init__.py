"""Trace loaders: Azure LLM inference 2023 (CSV), Mooncake FAST'25 (JSONL), ServeGen (client distributions)."""

from env.workloads.traces.azure import AZURE_COLUMNS, load_azure_csv
from env.workloads.traces.mooncake import load_mooncake_jsonl
from env.workloads.traces.servegen import ServeGenClient, load_servegen_folder
from env.workloads.traces.window import apply_window

__all__ = [
    "AZURE_COLUMNS",
    "ServeGenClient",
    "apply_window",
    "load_azure_csv",
    "load_mooncake_jsonl",
    "load_servegen_folder",
]
