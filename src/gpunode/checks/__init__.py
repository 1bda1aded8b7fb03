"""Node state checks, written for pytest-testinfra (one named test per fact, per layer).

Run by `gpunode check host.yml`, or by plain pytest against real nodes with the inventory that
gpunode writes (every expectation travels in its host variables)::

    pytest src/gpunode/checks --hosts='ansible://all' --ansible-inventory=INVENTORY
"""

import re
from pathlib import Path

from gpunode.ground.stagelist import STAGE_NAMES

CHECKS_DIR = Path(__file__).resolve().parent
# One layer per stage, named as the stage (test_<stage>.py), in the order a node is built: each
# layer stands on the ones before it.
LAYERS = STAGE_NAMES
# The skip reason the checks give for a host they cannot reach; gpunode check reports it once per
# host, as checks not run.
UNREACHABLE = "unreachable"


def tail(text: str, lines: int = 2, width: int = 300) -> str:
    """The last non-empty lines of an output, on one line."""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())[:width]


def result_field(text: str, name: str) -> str:
    """One bytes field of testinfra's CommandResult repr (command=b'...', _stderr=b'...'), decoded;
    testinfra puts that repr into the exceptions it raises."""
    match = re.search(rf"{name}=b(['\"])(.*?)(?<!\\)\1(?:, |\))", text, re.S)
    return match.group(2).encode().decode("unicode_escape", "replace") if match else ""
