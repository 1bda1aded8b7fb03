"""pydantic's errors as the host file's lines, ``path: message (line N)``: what each error type
says (a table from pydantic's error type to its wording), a hint where YAML 1.2 read a value
otherwise than its writer meant, one message for a union's branches, and a close key for an
unknown one."""

from __future__ import annotations

import difflib
import re
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from gpunode.ground.text import shown
from gpunode.ground.yamlsource import YamlSource, format_path
from gpunode.hostfile.schema import HostFile


def at(src: YamlSource, path: tuple[str | int, ...], text: str) -> str:
    """One problem line: ``path: text (line N)``, the line where ``path`` is written (if known)."""
    line = src.line_of(path)
    return f"{format_path(path)}: {text}" + (f" (line {line})" if line else "")


# What a type error asks for, to say several at once where a key takes a union of types.
_WANTED = {"string_type": "a string", "int_type": "a whole number", "float_type": "a number",
           "bool_type": "true or false", "list_type": "a list", "dict_type": "a mapping (key: value)",
           "model_type": "a mapping (key: value)", "model_attributes_type": "a mapping (key: value)",
           "none_required": "null", "path_type": "a path"}
_YES_NO = {"yes", "no", "y", "n", "on", "off"}


def _found(given: Any) -> str:
    """What YAML made of a value, in the file's terms."""
    if given is None:
        return "null"
    if isinstance(given, bool):
        return "true/false"
    if isinstance(given, int):
        return "a whole number"
    if isinstance(given, float):
        return "a number"
    if isinstance(given, dict):
        return "a mapping"
    if isinstance(given, list):
        return "a list"
    return "text"


def _number_text(given: str) -> str:
    """Why text is no number, where it looks like one: YAML 1.1's readings, or a quote."""
    text = given.strip()
    if re.fullmatch(r"[-+]?0[0-9]+", text):
        return (f" ({shown(given, quote=True)} is text: a leading 0 is octal in YAML 1.1 and decimal in 1.2; "
                "write it without the 0, or 0o... for octal)")
    if re.fullmatch(r"[-+]?[0-9]+(:[0-5]?[0-9])+(\.[0-9]*)?", text):
        return f" ({shown(given, quote=True)} is text: YAML 1.2 has no base-60 numbers)"
    if "_" in text and re.fullmatch(r"[-+]?[0-9][0-9_]*(\.[0-9_]*)?", text):
        return f" ({shown(given, quote=True)} is text: YAML 1.2 has no _ in numbers)"
    if re.fullmatch(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?", text):
        return f" ({shown(given, quote=True)} is quoted: write the number without quotes)"
    return ""


def _not_a_number(given: Any) -> str:
    if isinstance(given, str):
        return _number_text(given)
    if isinstance(given, bool):
        return f" (found {_found(given)})"
    return ""


def _not_a_whole_number(given: Any) -> str:
    if isinstance(given, float):
        return f" (found {shown(given)}: write it without a fraction)" if given.is_integer() else f" (found {shown(given)})"
    return _not_a_number(given)


def _not_a_boolean(given: Any) -> str:
    if isinstance(given, str) and given.lower() in _YES_NO:
        return f" ({shown(given, quote=True)} is text in YAML 1.2: write true or false)"
    if isinstance(given, str) and given.lower() in ("true", "false"):
        return f" ({shown(given, quote=True)} is quoted: write {given.lower()} without quotes)"
    if isinstance(given, (int, float)):
        return f" (found {_found(given)} {shown(given)})"
    return ""


def _not_a_string(given: Any) -> str:
    return "" if isinstance(given, str) else f" (YAML reads {shown(given)} as {_found(given)}: quote it)"


# The hint after a type error, by pydantic's error type, given the value YAML read.
_WHY_NOT: dict[str, Callable[[Any], str]] = {
    "int_type": _not_a_whole_number,
    "float_type": _not_a_number,
    "bool_type": _not_a_boolean,
    "string_type": _not_a_string,
}


def _why_not(kind: str, given: Any) -> str:
    """A hint after a type error: what YAML 1.2 read, where a YAML 1.1 reading or a quote misleads."""
    if isinstance(given, (dict, list)):
        return f" (found {_found(given)})"
    hint = _WHY_NOT.get(kind)
    return hint(given) if hint is not None else ""


# What an error says, by pydantic's error type (besides _WANTED's): a template filled from the
# error's ctx, or a function of the error.
_SAYS: dict[str, str | Callable[[dict[str, Any]], str]] = {
    "missing": "required key is missing",
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than_equal": "must be <= {le}",
    "less_than": "must be < {lt}",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "bool_parsing": "must be true or false",
    "finite_number": "must be a finite number (not .inf or .nan)",
    "string_pattern_mismatch": "has the wrong form (expected to match {pattern})",
    "literal_error": "must be {expected}",
    "too_short": lambda error: f"needs at least {(error.get('ctx') or {}).get('min_length')} item(s)",
    "value_error": lambda error: str((error.get("ctx") or {}).get("error", error["msg"])),
}


def _message(error: dict[str, Any]) -> str:
    kind = error["type"]
    if kind in _WANTED:
        return f"must be {_WANTED[kind]}" + _why_not(kind, error.get("input"))
    says = _SAYS.get(kind)
    if says is None:
        return str(error["msg"]).lower()
    if isinstance(says, str):
        return says.format_map(error.get("ctx") or {})
    return says(error)


def _suggest(key: str, model: type[BaseModel] | None) -> str:
    if model is None:
        return ""
    names = list(model.model_fields)
    close = difflib.get_close_matches(key, names, n=1)
    # A word the key ends in (on -> runs_on): too short for difflib to call it close.
    close = close or [name for name in names if key and name.endswith("_" + key)][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


def _model_at(path: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The pydantic model that the mapping at ``path`` is validated against, for suggestions."""
    model: Any = HostFile
    for part in path:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        annotation = field.annotation
        for candidate in getattr(annotation, "__args__", ()) + (annotation,):
            inner = getattr(candidate, "__args__", ())
            for option in inner + (candidate,):
                if isinstance(option, type) and issubclass(option, BaseModel):
                    model = option
                    break
            else:
                continue
            break
        else:
            return None
    return model if isinstance(model, type) else None


def _file_loc(loc: tuple[Any, ...], data: Any, missing: bool) -> tuple[str | int, ...]:
    """``loc`` as a path in the file: pydantic names union branches in it ('str', 'list[int]',
    'Ssh', "literal['all']"); a part that is not a key or index of the data there is one, except
    the last of a missing key."""
    path: list[str | int] = []
    node = data
    for index, part in enumerate(loc):
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and type(part) is int and 0 <= part < len(node):
            node = node[part]
        elif not (missing and index == len(loc) - 1):
            continue
        path.append(part)
    return tuple(path)


def _one_per_key(errors: list[dict[str, Any]], data: Any) -> list[tuple[tuple[str | int, ...], dict[str, Any], str]]:
    """(path, error, message) per error; the type errors of a union's branches at one key become
    one message (``must be a string, a number or true or false``)."""
    out: list[tuple[tuple[str | int, ...], dict[str, Any], str]] = []
    wanted: dict[tuple[str | int, ...], list[dict[str, Any]]] = {}
    located = [(_file_loc(tuple(error["loc"]), data, error["type"] == "missing"), error) for error in errors]
    # A branch that took the value's type and found more wrong says more than the branches that
    # did not take it (runs_on: {port: x} is an Ssh with a bad port, not a string that is wrong).
    said = {loc for loc, error in located if error["type"] not in _WANTED}
    deeper = {loc[:cut] for loc, _ in located for cut in range(len(loc))}
    for loc, error in located:
        if error["type"] in _WANTED and (loc in said or loc in deeper):
            continue
        if error["type"] in _WANTED:
            if loc not in wanted:
                out.append((loc, error, ""))  # its message is made below, once its branches are all known
            wanted.setdefault(loc, []).append(error)
        else:
            out.append((loc, error, _message(error)))
    for position, (loc, error, text) in enumerate(out):
        if text:
            continue
        branches = wanted[loc]
        if len(branches) == 1:
            out[position] = (loc, error, _message(error))
            continue
        nouns = list(dict.fromkeys(_WANTED[branch["type"]] for branch in branches))
        if "a number" in nouns and "a whole number" in nouns:
            nouns.remove("a whole number")
        if len(nouns) == 1:
            out[position] = (loc, error, _message(error))
            continue
        nouns = ["true/false" if noun == "true or false" else noun for noun in nouns]
        out[position] = (loc, error, f"must be {', '.join(nouns[:-1])} or {nouns[-1]} (found {_found(error.get('input'))})")
    return out


def problems_from(exc: ValidationError, src: YamlSource) -> list[str]:
    """Turn pydantic's errors into ``path: message (line N)`` lines, in file order."""
    lines: list[tuple[int, str]] = []
    seen: set[str] = set()
    for loc, error, text in _one_per_key(exc.errors(), src.data):
        if error["type"] == "extra_forbidden":
            text = "unknown key" + _suggest(str(loc[-1]), _model_at(loc[:-1]))
        line = src.line_of(loc)
        entry = f"{format_path(loc)}: {text}" + (f" (line {line})" if line else "")
        if entry not in seen:
            seen.add(entry)
            lines.append((line or 0, entry))
    return [entry for _, entry in sorted(lines, key=lambda item: item[0])]
