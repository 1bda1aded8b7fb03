"""Layer image: the server's image on the node's engine, its pins, and the verify result recorded
by the image stage."""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.checks.conftest import docker_inspect, node_record
from gpunode.image.context import LABEL_PREFIX

FIX = "run `gpunode provision --tags image`"


def _image(node: Any, hostvars: dict[str, Any]) -> dict[str, Any]:
    tag = hostvars["gpunode_server_image"]
    found = docker_inspect(node, "image", tag)
    if found is None:
        pytest.fail(f"{tag} is not on the node's engine -> {FIX}")
    return found


def test_server_image_present(gpu_node: Any, hostvars: dict[str, Any]) -> None:
    _image(gpu_node, hostvars)


def test_image_pins_match(gpu_node: Any, hostvars: dict[str, Any]) -> None:
    """Every pin of the host file's stack (and its own on top), as the image's labels record it."""
    if hostvars["gpunode_image_stand_in"]:
        pytest.skip("lab stand-in: the fake server's image carries no pins (the real image's are checked on a GPU node)")
    labels = _image(gpu_node, hostvars)["Config"].get("Labels") or {}
    wrong = [f"the image has {pin} {labels.get(f'{LABEL_PREFIX}.pin.{pin}')}, the host file pins {want}"
             for pin, want in hostvars["gpunode_image_pins"].items() if labels.get(f"{LABEL_PREFIX}.pin.{pin}") != str(want)]
    assert not wrong, "; ".join(wrong) + f" -> {FIX}"


def test_image_verified(gpu_node: Any, hostvars: dict[str, Any]) -> None:
    image = _image(gpu_node, hostvars)
    record = node_record(gpu_node, "image")
    assert record is not None, f"no verify result recorded on the node (/etc/gpunode/image.json) -> {FIX}"
    assert record["tag"] == hostvars["gpunode_server_image"], \
        f"the record is for {record['tag']}, the host file means {hostvars['gpunode_server_image']} -> {FIX}"
    assert record["id"] == image["Id"], f"the image changed since it was verified ({str(record['id'])[:19]}) -> {FIX}"
    if record["verified"] is None:
        pytest.skip(f"not verified: {record['note']}")
    assert record["verified"], f"verify failed: {', '.join(record['failed'])} -> {FIX} (README, 'The image')"
