"""One loader for every learned-policy artifact: the manifest's ``format`` picks the runtime.

* ``pdctl-learned-policy`` (action codecs 3 and 4, fixed slots): :class:`policies.learned.LearnedPolicy`;
* ``pdctl-set-policy`` (action codec 5, any layout up to its padding): :class:`policies.set_policy.SetPolicy`;
* ``pdctl-rule-selector`` (a learned choice among rule policies per tenant group, any layout):
  :class:`policies.rule_selector.RuleSelector`.

Artifacts written before the set policy existed carry the first format and load exactly as before.
"""

from __future__ import annotations

import json
from pathlib import Path

from policies.learned import MANIFEST_NAME, LearnedPolicy
from policies.rule_selector import SELECTOR_FORMAT, RuleSelector
from policies.set_policy import SET_FORMAT, SetPolicy

__all__ = ["artifact_format", "load_learned"]


def artifact_format(path: str | Path) -> str | None:
    """The ``format`` field of an artifact's manifest, or ``None`` when it cannot be read (the loader says why)."""
    try:
        data = json.loads((Path(path) / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    value = data.get("format") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def load_learned(path: str | Path) -> LearnedPolicy | SetPolicy | RuleSelector:
    """Load a learned-policy artifact directory with the runtime its manifest names.

    Raises:
        policies.learned.PolicyLoadError: the artifact is missing, malformed or from another build (one line).
    """
    fmt = artifact_format(path)
    if fmt == SET_FORMAT:
        return SetPolicy.load(path)
    if fmt == SELECTOR_FORMAT:
        return RuleSelector.load(path)
    return LearnedPolicy.load(path)
