"""Hide secrets in text that a person will read: log lines, error messages, reports.

``redact(text, known)`` replaces every value in ``known`` (the API key gpunode passed, a token read
from a secret file) and every value that the text itself says is secret:

- ``--api-key X``, ``--api-key=X``, ``--admin-api-key X``, ``'--api-key', 'X'`` (a list's repr):
  any ``--flag`` whose name looks secret (below);
- ``NAME=value`` and ``'NAME': 'value'`` / ``"NAME": "value"`` where NAME looks secret:
  ``api_key='...'`` in sglang's ServerArgs, ``HF_TOKEN=...`` in an environment;
- ``Authorization: <scheme> <credentials>`` and ``Bearer <token>``;
- the user-info of a URL: ``https://user:pass@host`` becomes ``https://***@host``.

A name looks secret when, with ``-`` read as ``_`` and case ignored, it ends in ``_TOKEN`` or
``_KEY`` or contains ``PASSWORD``, ``PASSWD`` or ``SECRET``. Values that hold nothing (``None``,
``null``, empty) are left as they are, so that ``admin_api_key=None`` still says there is none.

Linear time: each pattern can start a match only where a run of its characters begins, and no
quantified part can match what the part before or after it matches, so a failed attempt never
backtracks across more than the run it started on. A quoted value with no closing quote (a line
cut short) is hidden up to the end of its line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

HIDDEN = "***"

# A value: quoted (to the closing quote, or to the end of the line when the line was cut), or bare
# up to what ends a value in a command line, an environment or a Python repr.
_VALUE = r"""(?P<value>'[^'\n]*'?|"[^"\n]*"?|[^\s'",;)\]}&=][^\s'",;)\]}&]*)"""
_FLAG = re.compile(r"""(?<![\w-])--(?P<name>[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*)"""
                   r"""(?P<sep>=|['"]?,?[ \t]+(?!['"]?-))""" + _VALUE)
_ASSIGNMENT = re.compile(r"(?<![\w-])(?P<name>[A-Za-z_][\w-]*)(?P<sep>[ \t]*=[ \t]*)" + _VALUE)
_QUOTED_KEY = re.compile(r"""(?P<q>['"])(?P<name>[\w-]+)(?P=q)(?P<sep>[ \t]*:[ \t]*)""" + _VALUE)
_AUTHORIZATION = re.compile(r"""(?i)(?<![\w-])(?P<name>authorization)(?P<sep>['"]?[ \t]*[:=][ \t]*['"]?"""
                            r"""(?:(?:bearer|basic|token|digest)[ \t]+)?)(?P<value>[^\s'",;]+)""")
_BEARER = re.compile(r"(?i)(?<![\w-])(?P<name>bearer)(?P<sep>[ \t]+)(?P<value>[\w.~+/-]+=*)")
_USERINFO = re.compile(r"(?<![\w+.-])(?P<scheme>[A-Za-z][\w+.-]*://)[^/?#\s@]+@")
_EMPTY = frozenset({"", "None", "null", "none", "NULL", "True", "False", "true", "false", HIDDEN})


def secret_name(name: str) -> bool:
    """Does a flag, variable or field of this name hold a secret? (``api_key``, ``HF_TOKEN``,
    ``--admin-api-key``, ``ssl_keyfile_password``; not ``max_new_tokens`` or ``tokenizer_path``)."""
    word = name.strip("-_").upper().replace("-", "_")
    return word.endswith(("_TOKEN", "_KEY")) or any(part in word for part in ("PASSWORD", "PASSWD", "SECRET"))


def _hidden(value: str) -> str:
    """The value with its content hidden and its quotes kept; a value that holds nothing, unchanged."""
    quote = value[0] if value[:1] in ("'", '"') else ""
    closed = bool(quote) and len(value) > 1 and value.endswith(quote)
    if value[len(quote):len(value) - closed] in _EMPTY:
        return value
    return quote + HIDDEN + (quote if closed else "")


def _named(match: re.Match[str]) -> str:
    if not secret_name(match["name"]):
        return match[0]
    return match[0][:match.start("value") - match.start()] + _hidden(match["value"])


def _always(match: re.Match[str]) -> str:
    return match[0][:match.start("value") - match.start()] + _hidden(match["value"])


def redact(text: str, known: Iterable[str] = ()) -> str:
    """``text`` with every ``known`` value and every value it marks as secret replaced by ``***``."""
    # Longest first: a known value that holds a shorter one is hidden whole.
    for secret in sorted({value for value in known if value}, key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{HIDDEN}@", text)
    text = _AUTHORIZATION.sub(_always, text)
    text = _BEARER.sub(_always, text)
    text = _FLAG.sub(_named, text)
    text = _QUOTED_KEY.sub(_named, text)
    return _ASSIGNMENT.sub(_named, text)
