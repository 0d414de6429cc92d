"""The README's links and the repository paths it names resolve inside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
_PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.(?:md|yaml|yml|py|json|toml|txt))`")


def _targets(text: str) -> set[str]:
    links = {m.group(1) for m in _LINK.finditer(text) if not m.group(1).startswith(("http://", "https://"))}
    return links | {m.group(1) for m in _PATH.finditer(text)}


def test_readme_links_resolve_inside_the_repo() -> None:
    for doc in [ROOT / "README.md", ROOT / "docs" / "design.md", ROOT / "requirements" / "README.md"]:
        targets = _targets(doc.read_text())
        missing = sorted(t for t in targets if not ((doc.parent / t).exists() or (ROOT / t).exists()))
        assert missing == [], f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"
        outside = sorted(t for t in targets if t.startswith("../"))
        assert outside == [], f"{doc.relative_to(ROOT)} points outside the repository: {outside}"


def test_nothing_points_to_the_team_workspace_design_notes() -> None:
    found = subprocess.run(
        ["git", "grep", "-n", "shared/" + "DESIGN", "--", "."], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout
    assert found == ""
