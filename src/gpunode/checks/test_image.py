"""Layer image: the server's image on the node's engine, its pins, and the verify result recorded
by the image stage."""

from __future__ import annotations

from typing import Any

import pytest

from gpunode.checks.conftest import docker_inspect, node_record
from gpunode.hostfile import ImagePins
from gpunode.derive.imagecontext import LABEL_PREFIX

FIX = "run `gpunode provision --tags image`"


def _image(node: Any, gpunode_derived: dict[str, Any]) -> dict[str, Any]:
    tag = gpunode_derived["server_image"]
    found = docker_inspect(node, "image", tag)
    if found is None:
        pytest.fail(f"{tag} is not on the node's engine -> {FIX}")
    return found


def test_server_image_present(gpu_node: Any, gpunode_derived: dict[str, Any]) -> None:
    _image(gpu_node, gpunode_derived)


@pytest.mark.parametrize("pin", list(ImagePins.model_fields))
def test_image_pin_matches(pin: str, gpu_node: Any, gpunode_host: dict[str, Any],
                           gpunode_derived: dict[str, Any]) -> None:
    """One pin of the host file's stack (with the host file's own on top), as the image's labels
    record it; the pin names are the host file's, which every stack's pins use."""
    if gpunode_host["image"]["lab_stand_in"]:
        pytest.skip("lab stand-in: the fake server's image carries no pins (the real image's are checked on a GPU node)")
    want = gpunode_derived["pins"].get(pin)
    if want is None:
        pytest.skip(f"the host file's stack pins no {pin}")
    have = (_image(gpu_node, gpunode_derived)["Config"].get("Labels") or {}).get(f"{LABEL_PREFIX}.pin.{pin}")
    assert have == str(want), f"the image has {pin} {have}, the host file pins {want} -> {FIX}"


def test_image_verified(gpu_node: Any, gpunode_derived: dict[str, Any]) -> None:
    image = _image(gpu_node, gpunode_derived)
    record = node_record(gpu_node, "image")
    assert record is not None, f"no verify result recorded on the node (/etc/gpunode/image.json) -> {FIX}"
    assert record["tag"] == gpunode_derived["server_image"], \
        f"the record is for {record['tag']}, the host file means {gpunode_derived['server_image']} -> {FIX}"
    assert record["id"] == image["Id"], f"the image changed since it was verified ({str(record['id'])[:19]}) -> {FIX}"
    if record["verified"] is None:
        pytest.skip(f"not verified: {record['note']}")
    assert record["verified"], f"verify failed: {', '.join(record['failed'])} -> {FIX} (README, 'The image')"
