"""The CDI spec for Docker without the NVIDIA runtime, checked against the official CDI schema."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft7Validator
from referencing import Registry
from referencing.jsonschema import DRAFT7

from gpunode.stages.node import cdi
from gpunode_lab.contract import HOST_DRIVER_LAYOUT  # the recording the lab ships

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SCHEMA_DIR = FIXTURES / "cdi"
H200 = FIXTURES / "host" / "h200"
COLLECTION = Path(__file__).resolve().parents[2] / "src" / "gpunode"


def _char(major: int, minor: int, mode: str = "0o666") -> dict[str, Any]:
    return {"char": True, "major": major, "minor": minor, "mode": mode, "open_error": None}


# Two GPUs; nvidia-uvm's major is dynamic (509 here, 238 on the recorded H200).
SCAN: dict[str, Any] = {
    "devices": {
        "/dev/nvidia0": _char(195, 0),
        "/dev/nvidia1": _char(195, 1),
        "/dev/nvidiactl": _char(195, 255),
        "/dev/nvidia-modeset": _char(195, 254),
        "/dev/nvidia-uvm": _char(509, 0),
        "/dev/nvidia-uvm-tools": _char(509, 1),
        "/dev/nvidia-caps/nvidia-cap1": _char(511, 1, "0o400"),
        "/dev/nvidia-caps/nvidia-cap2": _char(511, 2, "0o444"),
    },
    "gpus": ["/dev/nvidia0", "/dev/nvidia1"],
    "caps": ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"],
    "proc_devices": {"nvidia": 195, "nvidiactl": 195, "nvidia-uvm": 509, "nvidia-caps": 511},
}

RO = ["ro", "nosuid", "nodev", "bind"]


def h200_tree() -> dict[str, Any]:
    """The manifest as the tree would write it, from the file names recorded on a real H200."""
    layout = json.loads((HOST_DRIVER_LAYOUT / "layout.json").read_text())
    return {
        "version": layout["version"],
        "libraries": [row["soname"] for row in layout["libraries"] if row["type"] == "file"],
        "binaries": [row["name"] for row in layout["bin"]],
    }


@pytest.fixture(scope="module")
def validator() -> Draft7Validator:
    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    # schema.json says $ref "defs.json#/..." with no $id, so register defs.json under that bare name;
    # defs.json names no $schema, so say it is draft 7 like schema.json.
    registry: Registry[Any] = Registry().with_resource("defs.json", DRAFT7.create_resource(defs))
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema, registry=registry)


# The CDI Go library's own checks that the schema leaves out (pkg/parser, specs-go): kind is
# vendor/class, device names are restricted, and parsing is strict (unknown fields fail).
NAME_PART = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
FIELDS = {
    "spec": {"cdiVersion", "kind", "annotations", "devices", "containerEdits"},
    "device": {"name", "annotations", "containerEdits"},
    "edits": {"env", "deviceNodes", "netDevices", "hooks", "mounts", "intelRdt", "additionalGids"},
    "node": {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"},
    "mount": {"hostPath", "containerPath", "options", "type"},
}


def go_library_errors(spec: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    vendor, _, klass = str(spec.get("kind", "")).partition("/")
    if not (NAME_PART.match(vendor) and NAME_PART.match(klass)):
        errors.append(f"bad kind {spec.get('kind')!r}")
    names = [device.get("name", "") for device in spec.get("devices", [])]
    errors += [f"bad device name {name!r}" for name in names if not DEVICE_NAME.match(name)]
    if len(set(names)) != len(names):
        errors.append("duplicate device names")

    def strict(obj: dict[str, Any], kind: str) -> None:
        errors.extend(f"unknown {kind} field {key!r}" for key in set(obj) - FIELDS[kind])

    def edits(obj: dict[str, Any]) -> None:
        strict(obj, "edits")
        for node in obj.get("deviceNodes", []):
            strict(node, "node")
        for mount in obj.get("mounts", []):
            strict(mount, "mount")

    strict(spec, "spec")
    edits(spec.get("containerEdits", {}))
    for device in spec.get("devices", []):
        strict(device, "device")
        edits(device.get("containerEdits", {}))
    return errors


def assert_valid(validator: Draft7Validator, spec: dict[str, Any]) -> None:
    errors = [error.message for error in validator.iter_errors(spec)] + go_library_errors(spec)
    assert errors == []


def nodes(edits: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {node["path"]: node for node in edits.get("deviceNodes", [])}


def device(spec: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [d for d in spec["devices"] if d["name"] == name]
    return found


def test_spec_for_two_gpus_is_valid_and_complete(validator: Draft7Validator) -> None:
    spec = cdi.spec(SCAN, h200_tree())
    assert_valid(validator, spec)
    # Round trip through the text Docker reads.
    assert_valid(validator, json.loads(cdi.dumps(spec)))

    assert spec["cdiVersion"] == "0.5.0"
    assert spec["kind"] == "gpunode.io/gpu"
    assert [d["name"] for d in spec["devices"]] == ["0", "1", "all"]
    assert nodes(device(spec, "0")["containerEdits"]) == {
        "/dev/nvidia0": {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 0o666}}
    assert list(nodes(device(spec, "1")["containerEdits"])) == ["/dev/nvidia1"]
    assert list(nodes(device(spec, "all")["containerEdits"])) == ["/dev/nvidia0", "/dev/nvidia1"]

    shared = spec["containerEdits"]
    assert set(shared) == {"deviceNodes", "mounts"}  # no hooks, no env
    control = nodes(shared)
    assert list(control) == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
    assert (control["/dev/nvidiactl"]["major"], control["/dev/nvidiactl"]["minor"]) == (195, 255)
    # nvidia-uvm's major changes at each boot: the runtime reads it from the node.
    assert "major" not in control["/dev/nvidia-uvm"] and "minor" not in control["/dev/nvidia-uvm-tools"]

    mounts = {m["containerPath"]: m for m in shared["mounts"]}
    assert mounts["/usr/local/nvidia/lib64/libcuda.so.1"] == {
        "hostPath": "/usr/local/nvidia/lib64/libcuda.so.1",
        "containerPath": "/usr/local/nvidia/lib64/libcuda.so.1",
        "options": RO,
    }
    assert mounts["/usr/local/nvidia/bin/nvidia-smi"]["options"] == RO
    assert "/usr/local/nvidia/lib64/libnvidia-ml.so.1" in mounts
    assert "/usr/local/nvidia/lib64/libnvidia-nvvm.so.4" in mounts
    assert all(m["hostPath"] == m["containerPath"] and m["options"] == RO for m in shared["mounts"])
    tree = h200_tree()
    assert len(shared["mounts"]) == len(tree["libraries"]) + len(tree["binaries"]) == 26 + 5


def test_caps_only_with_mig(validator: Draft7Validator) -> None:
    assert not any("nvidia-caps" in path for path in nodes(cdi.spec(SCAN, h200_tree())["containerEdits"]))
    spec = cdi.spec(SCAN, h200_tree(), mig=True)
    assert_valid(validator, spec)
    control = nodes(spec["containerEdits"])
    assert list(control)[-2:] == ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]
    assert control["/dev/nvidia-caps/nvidia-cap1"]["fileMode"] == 0o400  # the host's mode, kept


def test_spec_from_the_recorded_h200_scan(validator: Draft7Validator) -> None:
    scan = json.loads((H200 / "host-facts.json").read_text())["devices"]
    spec = cdi.spec(scan, h200_tree())
    assert_valid(validator, spec)
    assert [d["name"] for d in spec["devices"]] == ["0", "all"]
    control = nodes(spec["containerEdits"])
    assert list(control) == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]  # no modeset there
    assert control["/dev/nvidia-uvm"] == {"path": "/dev/nvidia-uvm", "type": "c", "fileMode": 0o666}


def test_gpus_selects_only_those(validator: Draft7Validator) -> None:
    spec = cdi.spec(SCAN, h200_tree(), gpus=[1])
    assert_valid(validator, spec)
    assert [d["name"] for d in spec["devices"]] == ["1", "all"]
    assert list(nodes(device(spec, "all")["containerEdits"])) == ["/dev/nvidia1"]
    assert "/dev/nvidia0" not in cdi.dumps(spec)


def test_the_validation_can_fail(validator: Draft7Validator) -> None:
    good = cdi.spec(SCAN, h200_tree())

    no_path = copy.deepcopy(good)
    del no_path["devices"][0]["containerEdits"]["deviceNodes"][0]["path"]
    assert any("'path' is a required property" in e.message for e in validator.iter_errors(no_path))

    kind_not_string = copy.deepcopy(good)
    kind_not_string["kind"] = 7
    assert list(validator.iter_errors(kind_not_string))

    no_devices = copy.deepcopy(good)
    del no_devices["devices"]
    assert list(validator.iter_errors(no_devices))

    mount_without_container_path = copy.deepcopy(good)
    del mount_without_container_path["containerEdits"]["mounts"][0]["containerPath"]
    assert list(validator.iter_errors(mount_without_container_path))

    # The schema takes any string as kind; the Go library's rules (mirrored above) do not.
    wrong_kind = copy.deepcopy(good)
    wrong_kind["kind"] = "gpunode.io"
    assert not list(validator.iter_errors(wrong_kind))
    assert go_library_errors(wrong_kind) == ["bad kind 'gpunode.io'"]

    typo = copy.deepcopy(good)
    typo["containerEdits"]["deviceNodes"][0]["filemode"] = 438
    assert go_library_errors(typo) == ["unknown node field 'filemode'"]


def without(path: str) -> dict[str, Any]:
    scan = copy.deepcopy(SCAN)
    del scan["devices"][path]
    return scan


@pytest.mark.parametrize("scan,gpus,message", [
    (without("/dev/nvidiactl"), "all", "control device node missing from the scan: /dev/nvidiactl"),
    (without("/dev/nvidia-uvm"), "all", "control device node missing from the scan: /dev/nvidia-uvm"),
    (SCAN, [0, 2], "GPU device node missing from the scan: /dev/nvidia2"),
    (without("/dev/nvidia1"), [1], "GPU device node missing from the scan: /dev/nvidia1"),
    ({"devices": {"/dev/nvidiactl": _char(195, 255)}}, "all", "the device scan has no GPU nodes (/dev/nvidiaN)"),
])
def test_missing_nodes_raise(scan: dict[str, Any], gpus: Any, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        cdi.spec(scan, h200_tree(), gpus=gpus)
    assert str(raised.value) == message
    assert "\n" not in message


def test_optional_control_nodes_may_be_absent(validator: Draft7Validator) -> None:
    spec = cdi.spec(without("/dev/nvidia-modeset"), h200_tree())
    assert_valid(validator, spec)
    assert "/dev/nvidia-modeset" not in nodes(spec["containerEdits"])


def test_bad_manifest_raises() -> None:
    with pytest.raises(ValueError, match="no libcuda.so.1"):
        cdi.spec(SCAN, {"libraries": ["libnvidia-ml.so.1"], "binaries": []})
    with pytest.raises(ValueError, match="bad file name"):
        cdi.spec(SCAN, {"libraries": ["libcuda.so.1", "../etc/shadow"], "binaries": []})


def test_deterministic() -> None:
    tree = h200_tree()
    text = cdi.dumps(cdi.spec(SCAN, tree))
    assert text.endswith("}\n")
    # Same input, and the same input shuffled: identical text.
    shuffled_scan = {**SCAN, "devices": dict(reversed(list(SCAN["devices"].items())))}
    shuffled_tree = {**tree, "libraries": list(reversed(tree["libraries"])) + ["libcuda.so.1"]}
    assert cdi.dumps(cdi.spec(SCAN, tree)) == text
    assert cdi.dumps(cdi.spec(shuffled_scan, shuffled_tree)) == text
    assert cdi.dumps(cdi.spec(SCAN, tree, gpus=[1, 0, 1])) == text
    assert list(json.loads(text)) == ["cdiVersion", "kind", "devices", "containerEdits"]


def test_root_moves_the_mounts() -> None:
    spec = cdi.spec(SCAN, h200_tree(), root="/opt/nvidia/")
    paths = [m["hostPath"] for m in spec["containerEdits"]["mounts"]]
    assert "/opt/nvidia/lib64/libcuda.so.1" in paths and "/opt/nvidia/bin/nvidia-smi" in paths
    with pytest.raises(ValueError, match="absolute"):
        cdi.spec(SCAN, h200_tree(), root="opt/nvidia")


def test_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(COLLECTION))
    from ansible_collections.gpunode.core.plugins.filter.node import FilterModule

    cdi_spec = FilterModule().filters()["cdi_spec"]
    tree = h200_tree()
    assert cdi_spec(SCAN, tree) == cdi.dumps(cdi.spec(SCAN, tree))
    assert cdi_spec(SCAN, tree, "/usr/local/nvidia", ["1"], True) == cdi.dumps(
        cdi.spec(SCAN, tree, gpus=[1], mig=True))
    with pytest.raises(ValueError):
        cdi_spec(SCAN, tree, gpus="1")
