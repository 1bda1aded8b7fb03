"""Where gpunode finds its playbooks and keeps its state."""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    """The checkout holding playbooks/ and roles/ (GPUNODE_HOME overrides)."""
    if "GPUNODE_HOME" in os.environ:
        return Path(os.environ["GPUNODE_HOME"]).resolve()
    return Path(__file__).resolve().parents[2]


def state_dir() -> Path:
    """Run artifacts and logs: GPUNODE_STATE_DIR, else $XDG_STATE_HOME/gpunode, else ~/.local/state/gpunode.

    Only resolved here; created by the command that writes into it, never by plan or a failed
    validation, so bad input changes nothing.
    """
    if "GPUNODE_STATE_DIR" in os.environ:
        return Path(os.environ["GPUNODE_STATE_DIR"]).expanduser().resolve()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpunode"
