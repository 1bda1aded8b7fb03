"""Where gpunode finds its Ansible collection and image inputs (inside the package, so a wheel
works from any folder), and where it keeps its state."""

from __future__ import annotations

import functools
import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # the gpunode package (this file is in ground/)
# The folder that holds ansible_collections/: what ANSIBLE_COLLECTIONS_PATH names for gpunode's runs.
COLLECTIONS_PATH = PACKAGE
COLLECTION = PACKAGE / "ansible_collections" / "gpunode" / "core"
PLAYBOOKS = COLLECTION / "playbooks"
MODULE_UTILS = COLLECTION / "plugins" / "module_utils"
ANSIBLE_CFG = PACKAGE / "ansible.cfg"
IMAGES = PACKAGE / "images"


@functools.cache
def control_path_dir() -> Path:
    """The folder of the shared SSH connections' sockets, as gpunode's ansible.cfg names it (Ansible's
    tasks, `gpunode check`'s testinfra and the stages' commands share them). Read once: every SSH
    command of a stage asks for it, and the file is the package's own."""
    import configparser

    config = configparser.ConfigParser()
    config.read(ANSIBLE_CFG)
    return Path(config.get("persistent_connection", "control_path_dir", fallback="~/.ansible/cp")).expanduser()


def state_dir() -> Path:
    """Run artifacts and logs: GPUNODE_STATE_DIR, else $XDG_STATE_HOME/gpunode, else ~/.local/state/gpunode.

    Only resolved here; created by the command that writes into it, never by plan or a failed
    validation, so bad input changes nothing.
    """
    if "GPUNODE_STATE_DIR" in os.environ:
        return Path(os.environ["GPUNODE_STATE_DIR"]).expanduser().resolve()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpunode"
