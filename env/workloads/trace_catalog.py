"""The public traces the scenarios replay: where each is published, at which commit, and its checksums.

A trace is a named set of files. Each file has a path inside the trace folder (the layout every scenario's
``${PDCTL_TRACES}/…`` path assumes), the URL of the file at a pinned upstream commit, and a SHA-256 sum
(``trace-SHA256SUMS`` beside this module, the sums of the files as published). ``pdctl traces fetch`` downloads and
verifies them; :func:`default_traces_dir` says where ``${PDCTL_TRACES}`` points when nobody says otherwise.

Resolution of the trace folder, first match wins:

1. an explicit folder (``--traces DIR``, a ``traces_dir`` argument);
2. the ``PDCTL_TRACES`` environment variable;
3. ``$PDCTL_DATA_DIR/traces`` (``./data/traces`` by default), where ``pdctl traces fetch`` stores them, when it exists;
4. ``../shared/traces`` beside a source checkout, when it exists (the team's workspace, never required);
5. otherwise ``$PDCTL_DATA_DIR/traces``, so that a missing file is reported there with the fetch command.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath

from policies.data_dir import data_dir as project_data_dir

__all__ = [
    "CATALOG",
    "TraceFile",
    "TraceSource",
    "data_dir",
    "default_traces_dir",
    "fetch_hint",
    "trace_names",
]

_RAW_GITHUB = "https://raw.githubusercontent.com"
_SUMS_FILE = Path(__file__).with_name("trace-SHA256SUMS")
_CHECKOUT_SHARED_TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"


@dataclass(frozen=True, slots=True)
class TraceFile:
    """One file of a trace.

    Attributes:
        relative_path: path inside the trace folder (POSIX), e.g. ``azure_llm_2023/AzureLLMInferenceTrace_code.csv``.
        url: the file at its pinned upstream commit.
        sha256: hex SHA-256 of the published file.
    """

    relative_path: str
    url: str
    sha256: str


@dataclass(frozen=True, slots=True)
class TraceSource:
    """A published trace: a repository at a pinned commit and the files taken from one folder of it.

    Attributes:
        name: the name ``pdctl traces fetch`` takes.
        description: one line for listings.
        repository: ``owner/name`` of the public repository.
        commit: the full commit hash the URLs pin.
        upstream_folder: the folder inside the repository.
        local_folder: the folder inside the trace folder.
        license: the data's licence, as the upstream repository states it.
    """

    name: str
    description: str
    repository: str
    commit: str
    upstream_folder: str
    local_folder: str
    license: str

    def files(self) -> tuple[TraceFile, ...]:
        """The files of this trace, with URLs and checksums, in a stable order."""
        out = []
        for relative, digest in _sums().items():
            path = PurePosixPath(relative)
            if path.parent != PurePosixPath(self.local_folder) or not self._owns(path.name):
                continue
            url = f"{_RAW_GITHUB}/{self.repository}/{self.commit}/{self.upstream_folder}/{path.name}"
            out.append(TraceFile(relative, url, digest))
        return tuple(sorted(out, key=lambda f: f.relative_path))

    def _owns(self, file_name: str) -> bool:
        # Two traces share the Azure and the Mooncake folders; each owns the files its name selects.
        return file_name in _SHARED_FOLDER_FILES.get(self.name, {file_name})


_SHARED_FOLDER_FILES: dict[str, set[str]] = {
    "azure-code": {"AzureLLMInferenceTrace_code.csv"},
    "azure-conv": {"AzureLLMInferenceTrace_conv.csv"},
    "mooncake-conversation": {"conversation_trace.jsonl"},
    "mooncake-synthetic": {"synthetic_trace.jsonl"},
}

_AZURE = ("Azure/AzurePublicDataset", "b469a113cedca53ddc3bdea71a143dc4b7d8700c", "data", "azure_llm_2023", "CC-BY-4.0")
_MOONCAKE = (
    "kvcache-ai/Mooncake",
    "3b5a594133958449a1feaf1c9e0fc1b553e34a28",
    "FAST25-release/traces",
    "mooncake_fast25",
    "Apache-2.0",
)
_SERVEGEN = (
    "alibaba/ServeGen",
    "f891d1189eb32b3868dfc443800c4150548c282a",
    "data/reason/deepseek-r1",
    "servegen_deepseek_r1",
    "Apache-2.0",
)

CATALOG: dict[str, TraceSource] = {
    source.name: source
    for source in (
        TraceSource("azure-code", "Azure LLM inference 2023, code (1 h, 8.8k requests)", *_AZURE),
        TraceSource("azure-conv", "Azure LLM inference 2023, conversation (1 h, 19k requests)", *_AZURE),
        TraceSource("mooncake-conversation", "Mooncake FAST'25 conversation, prefix-block hashes (1 h)", *_MOONCAKE),
        TraceSource("mooncake-synthetic", "Mooncake FAST'25 synthetic, prefix-block hashes (17 min)", *_MOONCAKE),
        TraceSource("servegen-deepseek-r1", "ServeGen DeepSeek-R1 client distributions (73 clients, 1 d)", *_SERVEGEN),
    )
}
"""Every trace ``pdctl traces fetch`` knows, by name."""


@cache
def _sums() -> dict[str, str]:
    sums: dict[str, str] = {}
    for line in _SUMS_FILE.read_text().splitlines():
        if line.strip():
            digest, relative = line.split(maxsplit=1)
            sums[relative.strip()] = digest
    return sums


def trace_names() -> list[str]:
    """The names of the known traces, sorted."""
    return sorted(CATALOG)


def data_dir() -> Path:
    """The project's data folder, absolute: ``$PDCTL_DATA_DIR``, else ``./data`` (beside MLflow's default SQLite file).

    Absolute because scenario files resolve relative trace paths against their own folder.
    """
    return project_data_dir().absolute()


def default_traces_dir() -> Path:
    """Where ``${PDCTL_TRACES}`` points when no folder is given (resolution order in the module docstring)."""
    if os.environ.get("PDCTL_TRACES"):
        return Path(os.environ["PDCTL_TRACES"]).absolute()
    fetched = data_dir() / "traces"
    if fetched.is_dir():
        return fetched
    if _CHECKOUT_SHARED_TRACES.is_dir():
        return _CHECKOUT_SHARED_TRACES
    return fetched


def fetch_hint(path: Path | str) -> str | None:
    """The fetch command for a missing trace file, if ``path`` is one of the catalogue's files; else None."""
    posix = PurePosixPath(Path(path).as_posix())
    for source in CATALOG.values():
        for file in source.files():
            relative = PurePosixPath(file.relative_path)
            if posix.parts[-len(relative.parts) :] == relative.parts:
                return f"trace {source.name!r} is missing: fetch it with `pdctl traces fetch {source.name}`"
    return None
