"""Loading a policy file: YAML text, an already parsed document or a path, validated as a whole; and dumping it.

Every problem is reported (schema, cross references, conflicts between levels), each with its file, line and
field (:class:`policies.policy_file.errors.PolicyFileError`); nothing of an invalid file takes effect.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from policies.policy_file.errors import PolicyFileError, PolicyProblem, YamlLineIndex, dotted_path
from policies.policy_file.resolve import ResolveError, resolve_located
from policies.policy_file.schema import PolicyFile, cross_reference_problems

__all__ = ["dump_policy_yaml", "load_policy_data", "load_policy_file", "load_policy_text"]


def load_policy_text(text: str, source: str = "<string>") -> PolicyFile:
    """Parse and validate a policy from YAML text. Raises :class:`PolicyFileError` naming every problem."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PolicyFileError([PolicyProblem(source, line, "", f"not valid YAML: {problem}")]) from exc
    index = YamlLineIndex(root)
    problems = [
        PolicyProblem(source, line, path, f"duplicate key {key!r}") for line, path, key in index.duplicate_keys()
    ]
    if data is None:
        problems.append(PolicyProblem(source, None, "", "empty policy file"))
    elif not isinstance(data, dict):
        problems.append(PolicyProblem(source, 1, "", f"expected a mapping at the top level, got {type(data).__name__}"))
    if problems:
        raise PolicyFileError(problems)
    return _validate(data, source, index)


def load_policy_data(data: object, source: str = "<document>") -> PolicyFile:
    """Validate a policy document that is already parsed (e.g. JSON from the admin API), as a file would be.

    The same checks as :func:`load_policy_text`, without text: problems name the field but no line.
    Raises :class:`PolicyFileError` naming every problem.
    """
    return _validate(data, source, YamlLineIndex(None))


def _validate(data: object, source: str, index: YamlLineIndex) -> PolicyFile:
    if not isinstance(data, Mapping):
        kind = type(data).__name__
        raise PolicyFileError([PolicyProblem(source, None, "", f"expected a mapping at the top level, got {kind}")])
    try:
        policy = PolicyFile.model_validate(dict(data))
    except ValidationError as exc:
        raise PolicyFileError(
            [
                PolicyProblem(source, index.line_of(err["loc"]), dotted_path(err["loc"]), _message(err))
                for err in exc.errors(include_url=False)
            ]
        ) from None
    cross = cross_reference_problems(policy)
    if cross:
        raise PolicyFileError([PolicyProblem(source, index.line_of(loc), dotted_path(loc), msg) for loc, msg in cross])
    try:
        resolve_located(policy, source)  # conflicts between levels (e.g. an inverted tenant threshold), with their line
    except ResolveError as exc:
        raise PolicyFileError([PolicyProblem(source, index.line_of(exc.loc), dotted_path(exc.loc), str(exc))]) from None
    return policy


def _message(err: Mapping[str, Any]) -> str:
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return "unknown key"
    text = str(err.get("msg", "invalid"))
    value = err.get("input")
    if kind not in ("missing", "value_error") and not isinstance(value, dict | list):
        text += f" (got {value!r})"
    return text.removeprefix("Value error, ")


def load_policy_file(path: str | Path) -> PolicyFile:
    """Read and validate a policy file; the error names the file, line and field of each problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyFileError([PolicyProblem(str(p), None, "", f"cannot read: {exc}")]) from exc
    return load_policy_text(text, str(p))


def dump_policy_yaml(policy: PolicyFile) -> str:
    """Serialise a policy file back to YAML (only the keys that were set; round-trips through the loader)."""
    data = policy.model_dump(mode="json", exclude_unset=True)
    return yaml.safe_dump(data, sort_keys=False)
