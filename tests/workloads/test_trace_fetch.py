"""`pdctl traces fetch` against a real HTTP server on loopback: verified downloads, mismatches, dead hosts."""

from __future__ import annotations

import functools
import hashlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from env.workloads.errors import TraceNotFoundError
from env.workloads.trace_catalog import CATALOG, default_traces_dir, fetch_hint
from env.workloads.trace_fetch import TraceFetchError, fetch_traces, file_sha256, resolve_names

AZURE_CODE = "azure_llm_2023/AzureLLMInferenceTrace_code.csv"


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A static HTTP server on 127.0.0.1 serving ``root`` (laid out like the trace folder)."""
    root = tmp_path / "mirror"
    root.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def test_catalog_pins_every_file_to_a_commit_and_a_sum() -> None:
    for source in CATALOG.values():
        assert len(source.commit) == 40
        files = source.files()
        assert files, source.name
        for file in files:
            assert len(file.sha256) == 64
            assert f"/{source.commit}/" in file.url
            assert file.url.endswith(Path(file.relative_path).name)
    assert len(CATALOG["servegen-deepseek-r1"].files()) == 146
    assert [f.relative_path for f in CATALOG["azure-code"].files()] == [AZURE_CODE]


def test_fetch_verifies_and_stores(mirror: tuple[str, Path], traces_dir: Path, tmp_path: Path) -> None:
    base_url, root = mirror
    (root / "azure_llm_2023").mkdir()
    (root / AZURE_CODE).write_bytes((traces_dir / AZURE_CODE).read_bytes())
    dest = tmp_path / "traces"
    seen: list[int] = []
    results = fetch_traces(["azure-code"], dest, base_url=base_url, on_progress=lambda _f, done, _t: seen.append(done))
    assert [r.outcome for r in results] == ["downloaded"]
    assert file_sha256(dest / AZURE_CODE) == CATALOG["azure-code"].files()[0].sha256
    assert seen
    assert seen[-1] == (dest / AZURE_CODE).stat().st_size
    assert _leftovers(dest) == [dest / AZURE_CODE]
    # A second fetch finds the verified file and downloads nothing.
    (root / AZURE_CODE).unlink()
    assert [r.outcome for r in fetch_traces(["azure-code"], dest, base_url=base_url)] == ["present"]


def test_checksum_mismatch_leaves_nothing(mirror: tuple[str, Path], tmp_path: Path) -> None:
    base_url, root = mirror
    (root / "azure_llm_2023").mkdir()
    (root / AZURE_CODE).write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:04.0000000,1,1\n")
    dest = tmp_path / "traces"
    with pytest.raises(TraceFetchError, match=r"AzureLLMInferenceTrace_code\.csv: checksum mismatch") as info:
        fetch_traces(["azure-code"], dest, base_url=base_url)
    assert "\n" not in str(info.value)
    assert hashlib.sha256((root / AZURE_CODE).read_bytes()).hexdigest() in str(info.value)
    assert _leftovers(dest) == []


def test_http_error_and_unreachable_host_are_one_line(mirror: tuple[str, Path], tmp_path: Path) -> None:
    base_url, _ = mirror
    dest = tmp_path / "traces"
    with pytest.raises(TraceFetchError, match=r"HTTP 404"):
        fetch_traces(["azure-conv"], dest, base_url=base_url)
    with pytest.raises(TraceFetchError, match=r"cannot be reached"):
        fetch_traces(["azure-conv"], dest, base_url=f"http://127.0.0.1:{_closed_port()}", timeout_s=5)
    assert _leftovers(dest) == []


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(TraceFetchError, match="unknown trace 'azure'; known traces: azure-code, azure-conv"):
        resolve_names(["azure"])
    assert resolve_names([]) == sorted(CATALOG)


def test_cli_fetch_exit_codes(mirror: tuple[str, Path], tmp_path: Path) -> None:
    base_url, root = mirror
    (root / "mooncake_fast25").mkdir()
    (root / "mooncake_fast25" / "synthetic_trace.jsonl").write_text('{"timestamp": 0}\n')
    dest = tmp_path / "traces"
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "pdctl",
            "traces",
            "fetch",
            "mooncake-synthetic",
            "--dest",
            str(dest),
            "--quiet",
            "--base-url",
            base_url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("pdctl traces fetch: mooncake_fast25/synthetic_trace.jsonl: checksum mismatch")
    assert len(bad.stderr.strip().splitlines()) == 1
    assert _leftovers(dest) == []


def test_missing_trace_names_the_fetch_command(tmp_path: Path) -> None:
    error = TraceNotFoundError(tmp_path / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv")
    assert str(error).endswith("trace 'azure-conv' is missing: fetch it with `pdctl traces fetch azure-conv`")
    assert fetch_hint(tmp_path / "mine.csv") is None
    assert str(TraceNotFoundError(tmp_path / "mine.csv")) == f"{tmp_path / 'mine.csv'}: no such file or folder"


def test_traces_folder_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PDCTL_TRACES", str(tmp_path / "explicit"))
    assert default_traces_dir() == tmp_path / "explicit"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PDCTL_TRACES", "relative")
    assert default_traces_dir() == tmp_path / "relative"  # absolute: scenario files resolve relative paths elsewhere
    monkeypatch.delenv("PDCTL_TRACES")
    monkeypatch.setenv("PDCTL_DATA_DIR", "data")
    (tmp_path / "data" / "traces").mkdir(parents=True)
    assert default_traces_dir() == tmp_path / "data" / "traces"
