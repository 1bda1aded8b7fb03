"""The patches of images/sglang/patches: what they change, whether they apply, whether they were applied.

A patch is a unified diff against site-packages (``patch -p1`` there), with free text before the
first ``---`` line saying why. ``applies`` runs ``patch --dry-run`` against a tree (e.g. the files
of the real sglang wheel); ``blocks_present`` checks an installed file holds the patched text.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Patch:
    name: str
    text: str
    # target path (relative to site-packages) -> runs of consecutive added lines
    added_blocks: dict[str, list[list[str]]]


class PatchFormatError(ValueError):
    """A patch file that is not a unified diff this project can apply."""


def _target(line: str) -> str:
    """``+++ b/sglang/x.py<TAB>date`` -> ``sglang/x.py`` (the -p1 path)."""
    path = line[4:].split("\t", 1)[0].strip()
    return path.split("/", 1)[1] if "/" in path else path


def parse_patch(name: str, text: str) -> Patch:
    blocks: dict[str, list[list[str]]] = {}
    current: list[list[str]] | None = None
    run: list[str] = []

    def close_run() -> None:
        nonlocal run
        if run and current is not None:
            current.append(run)
        run = []

    previous = ""
    for line in text.splitlines():
        is_header = line.startswith("+++ ") and previous.startswith("--- ")
        previous = line
        if is_header:
            close_run()
            current = blocks.setdefault(_target(line), [])
        elif current is not None and line.startswith("+"):
            run.append(line[1:])
        else:
            close_run()
    close_run()
    if not blocks:
        raise PatchFormatError(f"{name}: no '+++ b/<path>' header: not a unified diff")
    if not any(blocks.values()):
        raise PatchFormatError(f"{name}: adds no lines, so whether it is applied cannot be checked")
    return Patch(name, text, blocks)


def blocks_present(blocks: list[list[str]], text: str) -> bool:
    """Each run of added lines appears, whole and consecutive, among the file's lines."""
    lines = text.splitlines()
    return all(_contains_run(lines, block) for block in blocks)


def _contains_run(lines: list[str], block: list[str]) -> bool:
    width = len(block)
    return any(lines[i:i + width] == block for i in range(len(lines) - width + 1))


def applies(patch: Patch, root: Path) -> tuple[bool, str]:
    """Whether ``patch`` applies cleanly to the tree at ``root`` (nothing is changed)."""
    result = subprocess.run(["patch", "-p1", "--forward", "--batch", "--dry-run", "-d", str(root)],
                            input=patch.text, capture_output=True, text=True)
    output = (result.stdout + result.stderr).strip()
    if result.returncode == 0:
        return True, output
    return False, f"patch {patch.name} does not apply: {output}"
