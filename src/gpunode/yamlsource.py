"""Load YAML while remembering the line of every key and item.

Validation errors must name the YAML path *and* the line (``hosts[0].container.memory_gb: must
be > 0 (line 14)``), so the loader builds plain Python data from PyYAML's node tree and keeps a
map from path to line beside it. Duplicate keys are an error here: PyYAML would silently keep the
last one, and a typo'd copy of a key must not pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

PathKey = tuple[str | int, ...]
# A host file has a few hundred values. Aliases may repeat a block, but a file whose aliases
# expand past this many values is refused before it costs time or memory ("billion laughs").
MAX_VALUES = 10_000


class SourceError(Exception):
    """A problem with the file itself (unreadable, not YAML), before any schema check."""


@dataclass
class YamlSource:
    """Plain data loaded from a YAML file and the line (1-based) of each path in it."""

    data: Any
    lines: dict[PathKey, int] = field(default_factory=dict)
    problems: list[tuple[PathKey, str, int]] = field(default_factory=list)
    values: int = 0  # values built so far, aliases counted each time they expand
    open_nodes: set[int] = field(default_factory=set)  # ids of the nodes being built (a cycle check)

    def line_of(self, path: PathKey) -> int | None:
        """Line of the deepest prefix of ``path`` that exists in the file."""
        for cut in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:cut]))
            if line is not None:
                return line
        return None


def format_path(path: PathKey) -> str:
    """``('hosts', 0, 'container')`` -> ``hosts[0].container``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(top level)"


def _scalar(node: ScalarNode) -> Any:
    # A fresh constructor per scalar keeps PyYAML's own typing rules (ints, bools, nulls, dates).
    return SafeConstructor().construct_object(node, deep=True)


class AliasBomb(Exception):
    """Aliases that refer to themselves or expand past MAX_VALUES."""


def _build(node: Node, path: PathKey, src: YamlSource) -> Any:
    src.lines.setdefault(path, node.start_mark.line + 1)
    src.values += 1
    if src.values > MAX_VALUES:
        raise AliasBomb(f"{format_path(path)}: YAML aliases expand past {MAX_VALUES} values; a host file is far "
                        f"smaller (line {node.start_mark.line + 1})")
    if id(node) in src.open_nodes:
        raise AliasBomb(f"{format_path(path)}: a YAML alias refers to the value that holds it "
                        f"(line {node.start_mark.line + 1})")
    if isinstance(node, (MappingNode, SequenceNode)):
        src.open_nodes.add(id(node))
        try:
            return _build_collection(node, path, src)
        finally:
            src.open_nodes.discard(id(node))
    return _scalar(node)


def _build_collection(node: MappingNode | SequenceNode, path: PathKey, src: YamlSource) -> Any:
    if isinstance(node, MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                src.problems.append((path, "YAML merge keys (<<) are not supported", key_node.start_mark.line + 1))
                continue
            key = _build(key_node, path + ("<key>",), src) if not isinstance(key_node, ScalarNode) else _scalar(key_node)
            if not isinstance(key, str):
                # YAML 1.1 reads a bare on/off/yes/no as a boolean: say which word was written.
                why = ""
                if isinstance(key, bool) and isinstance(key_node, ScalarNode):
                    why = f" (YAML reads {key_node.value!r} as {key}" + (
                        ": the router's key is runs_on)" if key_node.value.lower() == "on" else ": quote it)")
                src.problems.append((path, f"key {key!r} must be a string{why}", key_node.start_mark.line + 1))
                key = str(key)
            child = path + (key,)
            if key in out:
                first = src.lines.get(child)
                src.problems.append((child, f"duplicate key (first given on line {first})", key_node.start_mark.line + 1))
            src.lines[child] = key_node.start_mark.line + 1
            out[key] = _build(value_node, child, src)
        return out
    return [_build(item, path + (index,), src) for index, item in enumerate(node.value)]


def load_yaml(path: Path) -> YamlSource:
    """Read ``path`` into plain data with line numbers; raise SourceError with a one-line reason."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SourceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SourceError(f"{path}: is a directory, not a host file") from None
    except PermissionError:
        raise SourceError(f"{path}: permission denied") from None
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        reason = exc.problem or exc.context or "invalid YAML"
        raise SourceError(f"{path}: YAML syntax error: {reason} ({where})") from None
    except yaml.YAMLError as exc:  # pragma: no cover - PyYAML raises marked errors for text input
        raise SourceError(f"{path}: YAML error: {exc}") from None
    except RecursionError:
        raise SourceError(f"{path}: YAML nested too deeply for a host file") from None
    if len(nodes) > 1:
        raise SourceError(f"{path}: holds {len(nodes)} YAML documents; a host file is one document")
    src = YamlSource(data=None)
    if not nodes or nodes[0] is None:
        raise SourceError(f"{path}: is empty")
    try:
        src.data = _build(nodes[0], (), src)
    except AliasBomb as exc:
        raise SourceError(f"{path}: {exc}") from None
    except RecursionError:
        raise SourceError(f"{path}: YAML nested too deeply for a host file") from None
    return src
