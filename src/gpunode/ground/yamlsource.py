"""Read a host file: one strict reading of a small YAML subset, remembering the line of every key.

Validation errors must name the YAML path *and* the line (``hosts[0].container.memory_gb: must
be > 0 (line 14)``), so the loader builds plain Python data from PyYAML's node tree and keeps a
map from path to line beside it. What it accepts (README "The host file's YAML subset"):

- a regular file of at most MAX_BYTES, UTF-8, holding one YAML document;
- mappings with string keys (no duplicates, no ``<<`` merge keys), sequences, and scalars;
- plain scalars typed by YAML 1.2's core schema and nothing else: ``null``/``~``/empty, ``true``/
  ``false`` (also ``True``, ``TRUE``...), decimal whole numbers, ``0o17`` and ``0x1F``, decimal
  floats and ``.inf``/``.nan``. Everything else is a string: ``yes``, ``on``, ``0200`` (octal in
  YAML 1.1), ``8:20`` (base 60 in YAML 1.1), ``2024-01-01``, ``1_000``. Quoted scalars are strings;
- whole numbers of at most MAX_DIGITS digits, at most MAX_VALUES values (aliases counted each time
  they expand), nested at most MAX_DEPTH deep, and no NUL character in any value.

Refused, each with one line naming the path and the line: any explicit tag (``!!int``, ``!foo``,
``!``, on a scalar, mapping or sequence), a ``%TAG`` directive, ``%YAML`` other than 1.2, and
anything past a bound above. PyYAML's own reading would run a 1.1 resolver and its constructors
(``!!python/object`` included) instead; here only its parser and composer are used, and the
scalars are typed by the rules above.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.events import AliasEvent, DocumentStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from gpunode.ground.text import shown

try:  # libyaml's parser: the scanning is C, the composing below stays Python
    from yaml.cyaml import CParser as _CParser
except ImportError:  # pragma: no cover - PyYAML wheels carry libyaml
    _CParser = None

PathKey = tuple[str | int, ...]
# A host file is a few KiB; the cap keeps a wrong file (a log, /dev/zero, a disk image) from being
# read into memory or parsed for seconds.
MAX_BYTES = 1 << 20
# A host file has a few hundred values. Aliases may repeat a block, but a file whose aliases
# expand past this many values is refused before it costs time or memory ("billion laughs").
MAX_VALUES = 10_000
# The deepest host file value is about 6 levels down; past this the composer would recurse for ever.
MAX_DEPTH = 64
# A host file's largest number is a vmid (9 digits) or a byte count; 20 digits holds any 64-bit
# value and keeps int() far from Python's 4,300-digit limit.
MAX_DIGITS = 20

# YAML 1.2 core schema (yaml.org/spec/1.2.2, 10.3.2), for plain scalars only.
_NULL = re.compile(r"null|Null|NULL|~|")
_TRUE = re.compile(r"true|True|TRUE")
_FALSE = re.compile(r"false|False|FALSE")
_DECIMAL = re.compile(r"[-+]?[0-9]+")
_OCTAL = re.compile(r"0o[0-7]+")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INF = re.compile(r"[-+]?\.(inf|Inf|INF)")
_NAN = re.compile(r"\.(nan|NaN|NAN)")
_CORE = "tag:yaml.org,2002:"


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
    tags: dict[int, str] = field(default_factory=dict)  # id of a node -> the tag written on it

    def line_of(self, path: PathKey) -> int | None:
        """Line of the deepest prefix of ``path`` that exists in the file."""
        for cut in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:cut]))
            if line is not None:
                return line
        return None


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


def format_path(path: PathKey) -> str:
    """``('hosts', 0, 'container')`` -> ``hosts[0].container``; a key that is not a plain word is
    shown quoted and escaped (it came from the file: it may hold anything)."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
            continue
        name = part if _PLAIN_KEY.fullmatch(part) else shown(part, limit=40, quote=True)
        text += f".{name}" if text else name
    return text or "(top level)"


class Refused(Exception):
    """What the reading refuses of the whole file, found while composing or building (one line)."""


class _BadScalar(ValueError):
    """A scalar the reading refuses; the caller adds its path and line."""


def _tag_text(tag: str) -> str:
    return "!!" + tag[len(_CORE):] if tag.startswith(_CORE) else tag


if _CParser is not None:
    _Parser: type = _CParser
else:  # pragma: no cover
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _PyParser(Reader, Scanner, Parser):
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)

    _Parser = _PyParser


class _Composer(Composer, _Parser, Resolver):  # type: ignore[misc,valid-type]
    """PyYAML's composer on libyaml's events, noting every explicit tag and bounding the node
    count and depth as it goes. The resolver only tags nodes (``<<`` as a merge key); nothing is
    constructed from a tag."""

    def __init__(self, text: str, tags: dict[int, str]) -> None:
        _Parser.__init__(self, text)
        Composer.__init__(self)
        Resolver.__init__(self)
        self.tags = tags
        self.nodes = 0
        self.depth = 0

    def compose_document(self) -> Node | None:
        start = self.peek_event()
        if isinstance(start, DocumentStartEvent):
            line = start.start_mark.line + 1
            if start.tags:
                raise Refused(f"a %TAG directive: a host file takes no YAML tags (line {line})")
            if start.version is not None and tuple(start.version) != (1, 2):
                version = ".".join(str(part) for part in start.version)
                raise Refused(f"%YAML {version}: a host file is read as YAML 1.2 (line {line})")
        return super().compose_document()

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        tag = None if isinstance(event, AliasEvent) else getattr(event, "tag", None)
        self.nodes += 1
        if self.nodes > MAX_VALUES:
            raise Refused(f"more than {MAX_VALUES} YAML values; a host file is far smaller "
                          f"(line {event.start_mark.line + 1})")
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise RecursionError
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        if tag is not None and node is not None:
            self.tags[id(node)] = tag
        return node


def _number_of(digits: str, base: int) -> int:
    count = len(digits.lstrip("+-"))
    if count > MAX_DIGITS:
        raise _BadScalar(f"a whole number of {count} digits: a host file's numbers have at most {MAX_DIGITS}")
    return int(digits, base)


def _scalar(node: ScalarNode) -> Any:
    """A scalar's value: quoted is a string; plain is typed by YAML 1.2's core schema."""
    value: str = node.value
    if "\x00" in value:
        raise _BadScalar("holds a NUL character (\\x00): a host file's values are text")
    if node.style not in (None, ""):
        return value
    return plain_value(value)


def plain_value(value: str) -> Any:
    """What ``value`` written as a plain (unquoted) scalar reads as (ValueError: refused)."""
    if _NULL.fullmatch(value):
        return None
    if _TRUE.fullmatch(value):
        return True
    if _FALSE.fullmatch(value):
        return False
    if _DECIMAL.fullmatch(value):
        # A leading zero is octal in YAML 1.1 and decimal in 1.2: it stays text (a number key
        # refuses it, saying why), never a silent 128 for 0200.
        if len(value.lstrip("+-")) > 1 and value.lstrip("+-").startswith("0"):
            return value
        return _number_of(value, 10)
    if _OCTAL.fullmatch(value):
        return _number_of(value[2:], 8)
    if _HEX.fullmatch(value):
        return _number_of(value[2:], 16)
    if _FLOAT.fullmatch(value):
        return float(value)
    if _INF.fullmatch(value):
        return float("-inf") if value.startswith("-") else float("inf")
    if _NAN.fullmatch(value):
        return float("nan")
    return value


def _build(node: Node, path: PathKey, src: YamlSource) -> Any:
    line = node.start_mark.line + 1
    src.lines.setdefault(path, line)
    src.values += 1
    if src.values > MAX_VALUES:
        raise Refused(f"{format_path(path)}: YAML aliases expand past {MAX_VALUES} values; a host file is far "
                      f"smaller (line {line})")
    if id(node) in src.open_nodes:
        raise Refused(f"{format_path(path)}: a YAML alias refers to the value that holds it (line {line})")
    tag = src.tags.get(id(node))
    if tag is not None:
        src.problems.append((path, f"YAML tag {shown(_tag_text(tag), limit=40)}: a host file takes plain values, "
                                   "no tags (remove it; quote a value meant as text)", line))
        return None
    if isinstance(node, (MappingNode, SequenceNode)):
        src.open_nodes.add(id(node))
        try:
            return _build_collection(node, path, src)
        finally:
            src.open_nodes.discard(id(node))
    try:
        return _scalar(node)
    except _BadScalar as exc:
        src.problems.append((path, str(exc), line))
        return None


def _key_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    return "a number"


def _build_collection(node: MappingNode | SequenceNode, path: PathKey, src: YamlSource) -> Any:
    if isinstance(node, SequenceNode):
        return [_build(item, path + (index,), src) for index, item in enumerate(node.value)]
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key_line = key_node.start_mark.line + 1
        if key_node.tag == _CORE + "merge" and id(key_node) not in src.tags:
            src.problems.append((path, "YAML merge keys (<<) are not supported", key_line))
            continue
        if not isinstance(key_node, ScalarNode):
            src.problems.append((path, "a key must be a plain string, not a mapping or list", key_line))
            continue
        if id(key_node) in src.tags:
            src.problems.append((path, f"YAML tag {shown(_tag_text(src.tags[id(key_node)]), limit=40)} on a key: "
                                       "a host file takes plain values, no tags", key_line))
            continue
        try:
            key = _scalar(key_node)
        except _BadScalar as exc:
            src.problems.append((path, f"key: {exc}", key_line))
            continue
        if not isinstance(key, str):
            src.problems.append((path, f"key {shown(key_node.value, limit=40)} must be a string (YAML reads it as "
                                       f"{_key_kind(key)}: quote it)", key_line))
            continue
        child = path + (key,)
        if key in out:
            first = src.lines.get(child)
            src.problems.append((child, f"duplicate key (first given on line {first})", key_line))
        src.lines[child] = key_line
        out[key] = _build(value_node, child, src)
    return out


_KINDS = ((stat.S_ISDIR, "is a directory"), (stat.S_ISFIFO, "is a FIFO (named pipe)"),
          (stat.S_ISSOCK, "is a socket"), (stat.S_ISCHR, "is a character device"),
          (stat.S_ISBLK, "is a block device"))
_ERRNO = {errno.ENOENT: "no such file", errno.EACCES: "permission denied", errno.EPERM: "permission denied",
          errno.ELOOP: "too many levels of symbolic links (a symlink loop?)", errno.ENAMETOOLONG: "file name too long",
          errno.ENOTDIR: "a part of the path is not a directory", errno.EISDIR: "is a directory, not a host file",
          errno.EIO: "input/output error while reading", errno.ENXIO: "no such device or address"}


def _os_problem(exc: OSError) -> str:
    return _ERRNO.get(exc.errno or 0) or shown(exc.strerror or type(exc).__name__)


def _not_regular(mode: int) -> str | None:
    for test, kind in _KINDS:
        if test(mode):
            return f"{kind}, not a host file (a host file is a regular file)"
    return None if stat.S_ISREG(mode) else "is not a regular file"


def _too_big(size: str) -> str:
    return f"is {size} bytes: a host file is at most {MAX_BYTES} bytes ({MAX_BYTES >> 20} MiB)"


def read_text(path: Path) -> str:
    """The text of a regular file of at most MAX_BYTES, UTF-8; SourceError with one line otherwise.

    Opened non-blocking after a stat, so a FIFO or a device is refused instead of read (a FIFO
    would block for ever, /dev/zero never ends); the cap is checked on the size and again while
    reading, for a file that grows or a /proc file that says 0.
    """
    name = shown(str(path), limit=240)
    try:
        before = os.stat(path)
        kind = _not_regular(before.st_mode)
        if kind:
            raise SourceError(f"{name}: {kind}")
        if before.st_size > MAX_BYTES:
            raise SourceError(f"{name}: {_too_big(str(before.st_size))}")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        try:
            kind = _not_regular(os.fstat(fd).st_mode)  # what was opened, not what was stat'ed
            if kind:
                raise SourceError(f"{name}: {kind}")
            chunks: list[bytes] = []
            size = 0
            while True:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_BYTES:
                    raise SourceError(f"{name}: {_too_big(f'more than {MAX_BYTES}')}")
                chunks.append(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        raise SourceError(f"{name}: {_os_problem(exc)}") from None
    except ValueError:  # a NUL byte in the path itself
        raise SourceError(f"{name}: not a valid path (it holds a NUL character)") from None
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{name}: not UTF-8 text (byte {exc.start})") from None


def _syntax_error(name: str, text: str, exc: yaml.YAMLError) -> SourceError:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        reason = exc.problem or exc.context or "invalid YAML"
        if "nesting depth" in reason:  # libyaml's own bound (1000 levels), met before MAX_DEPTH in flow style
            return SourceError(f"{name}: YAML nested too deeply for a host file (more than {MAX_DEPTH} levels)")
    elif isinstance(exc, yaml.reader.ReaderError):
        # libyaml counts the position in bytes of the UTF-8 text, PyYAML's reader in characters
        before = (text.encode("utf-8", "replace")[:exc.position].decode("utf-8", "ignore") if _CParser is not None
                  else text[:exc.position])
        where = f"line {before.count(chr(10)) + 1}"
        reason = f"character #x{exc.character:04x}: {exc.reason}" if isinstance(exc.character, int) else exc.reason
    else:  # pragma: no cover - the parser raises one of the two above
        where, reason = "unknown position", type(exc).__name__
    return SourceError(f"{name}: YAML syntax error: {shown(reason, limit=120)} ({where})")


def load_yaml(path: Path) -> YamlSource:
    """Read ``path`` into plain data with line numbers; raise SourceError with a one-line reason."""
    text = read_text(path)
    name = shown(str(path), limit=240)
    src = YamlSource(data=None)
    composer = _Composer(text, src.tags)
    nodes: list[Node] = []
    try:
        while composer.check_node():
            node = composer.get_node()
            if node is not None:
                nodes.append(node)
    except yaml.YAMLError as exc:
        raise _syntax_error(name, text, exc) from None
    except Refused as exc:
        raise SourceError(f"{name}: {exc}") from None
    except RecursionError:
        raise SourceError(f"{name}: YAML nested too deeply for a host file (more than {MAX_DEPTH} levels)") from None
    finally:
        composer.dispose()
    if len(nodes) > 1:
        raise SourceError(f"{name}: holds {len(nodes)} YAML documents; a host file is one document")
    if not nodes:
        raise SourceError(f"{name}: is empty")
    try:
        src.data = _build(nodes[0], (), src)
    except Refused as exc:
        raise SourceError(f"{name}: {exc}") from None
    except RecursionError:  # pragma: no cover - the composer bounds the depth
        raise SourceError(f"{name}: YAML nested too deeply for a host file") from None
    return src
