"""The order of a rolling change and when it stops: plain rules, no I/O.

The rules are Ansible's own for a play with ``serial`` and ``max_fail_percentage`` (ansible-core
2.19.14): hosts go in batches of ``batch`` in the file's order, the last one smaller; a batch stops
the roll when its failed hosts are more than ``max_fail_percent`` of the batch size
(lib/ansible/plugins/strategy/linear.py:337-340, so 0 stops at the first failure), and always when
every host of it failed (lib/ansible/executor/playbook_executor.py:199-202).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def batches(names: Sequence[str], size: int) -> list[list[str]]:
    """``names`` in their order, ``size`` at a time (the last batch takes what is left)."""
    if size < 1:
        raise ValueError(f"a batch takes at least one host, not {size}")
    return [list(names[start:start + size]) for start in range(0, len(names), size)]


def stops(failed: int, batch_size: int, max_fail_percent: int) -> bool:
    """Whether a batch of ``batch_size`` hosts with ``failed`` failures stops the roll."""
    if failed <= 0:
        return False
    return failed >= batch_size or failed * 100 > max_fail_percent * batch_size


@dataclass(frozen=True)
class RollOrder:
    """Which hosts go when: ``steady`` keep their servers and are provisioned together first; the
    ``rolling`` ones restart theirs and go ``batch`` at a time."""

    steady: tuple[str, ...]
    rolling: tuple[tuple[str, ...], ...]

    @property
    def rolls(self) -> bool:
        return bool(self.rolling)


def order(hosts: Sequence[str], restarting: set[str], batch: int) -> RollOrder:
    """The roll for ``hosts`` (the file's order) where ``restarting`` is the set whose servers a
    provision restarts now."""
    unknown = restarting - set(hosts)
    if unknown:
        raise ValueError(f"not hosts of the file: {', '.join(sorted(unknown))}")
    steady = tuple(name for name in hosts if name not in restarting)
    return RollOrder(steady, tuple(tuple(group) for group in batches([n for n in hosts if n in restarting], batch)))
