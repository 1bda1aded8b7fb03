"""Shared by gpunode.core's filters (controller side): without the gpunode package, a filter
still loads and says what it needs when used."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible.errors import AnsibleFilterError


def filters_needing_gpunode(filters: dict[str, Any], import_error: ImportError | None) -> dict[str, Callable[..., Any]]:
    """The filters as they are, or, where the gpunode package did not import, ones that say so."""
    if import_error is None:
        return filters

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise AnsibleFilterError(f"gpunode.core filters need the gpunode Python package ({import_error}): "
                                 "run them through gpunode or its interpreter")
    return {name: missing for name in filters}
