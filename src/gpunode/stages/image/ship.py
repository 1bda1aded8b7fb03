"""Copy an image from one Docker engine to another (``image.build_on: local``, the lab's stand-in).

Streamed: ``docker save`` on the source feeds ``docker load`` on the target chunk by chunk, so an
image of the pinned stack (~12 GB) never sits in memory. Nothing moves when the target already
holds the same image ID under the tag.
"""

from __future__ import annotations

from typing import Any

import docker

CHUNK = 4 * 1024 * 1024


def image_id(client: Any, tag: str) -> str | None:
    """The ID of ``tag`` on ``client``'s engine, or None when it has no such image."""
    try:
        return str(client.images.get(tag).id)
    except docker.errors.ImageNotFound:
        return None


def ship(source: Any, target: Any, tag: str) -> bool:
    """Make ``target`` hold ``tag`` as ``source`` has it; True when it had to be copied."""
    image = source.images.get(tag)
    if image_id(target, tag) == image.id:
        return False
    target.images.load(image.save(chunk_size=CHUNK, named=True))
    if image_id(target, tag) != image.id:
        raise docker.errors.DockerException(f"{tag} did not arrive on the node's engine as {image.id[:19]}")
    return True
