"""Problems of a refused policy file, one line each (``FILE:LINE: field.path: message``), and where they are.

:class:`YamlLineIndex` maps a pydantic error location (``("tenants", 0, "slo")``) to the YAML line that holds
it and finds the keys a mapping repeats (YAML itself keeps the last silently); :func:`dotted_path` writes a
location as ``tenants[0].slo``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import yaml

__all__ = ["PolicyFileError", "PolicyProblem", "YamlLineIndex", "dotted_path"]


@dataclass(frozen=True, slots=True)
class PolicyProblem:
    """One problem found in a policy file."""

    source: str
    line: int | None
    field_path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line is not None else self.source
        text = f"{where}: {self.field_path or '<top>'}: {self.message}"
        return text.replace("\r", "\\r").replace("\n", "\\n")  # always one line


class PolicyFileError(ValueError):
    """A policy file was refused; ``problems`` holds one entry per problem."""

    def __init__(self, problems: Sequence[PolicyProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


def dotted_path(loc: Sequence[str | int]) -> str:
    """A location as one would write it: ``("tenants", 0, "slo")`` -> ``tenants[0].slo``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        name = part if part.isidentifier() or part.replace("-", "_").isidentifier() else repr(part)
        out += f".{name}" if out else name
    return out


class YamlLineIndex:
    """Maps pydantic error locations to YAML line numbers; finds duplicate keys on the way."""

    def __init__(self, root: yaml.Node | None) -> None:
        self.root = root

    def line_of(self, loc: Sequence[str | int]) -> int | None:
        """The line of ``loc``, or of its deepest ancestor the YAML has (None without a document)."""
        node = self.root
        line = None if node is None else node.start_mark.line + 1
        for part in loc:
            child = self._child(node, part)
            if child is None:
                break
            node = child
            line = node.start_mark.line + 1
        return line

    @staticmethod
    def _child(node: yaml.Node | None, part: str | int) -> yaml.Node | None:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == part:
                    return value if isinstance(value, yaml.Node) else None
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            child = node.value[part]
            return child if isinstance(child, yaml.Node) else None
        return None

    def duplicate_keys(self) -> Iterator[tuple[int, str, str]]:
        """Yield (line, path, key) for every repeated key of a mapping."""
        stack: list[tuple[yaml.Node, str]] = [] if self.root is None else [(self.root, "")]
        while stack:
            node, path = stack.pop()
            if isinstance(node, yaml.MappingNode):
                seen: set[str] = set()
                for key, value in node.value:
                    name = str(key.value)
                    child_path = f"{path}.{name}" if path else name
                    if name in seen:
                        yield key.start_mark.line + 1, child_path, name
                    seen.add(name)
                    stack.append((value, child_path))
            elif isinstance(node, yaml.SequenceNode):
                stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node.value))
