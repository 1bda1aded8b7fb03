"""A fleet in one host file: many hosts and a router (inventory/lab/fleet.yml), as data: what the
host file accepts and refuses, what is derived for the router once, what the inventory carries,
how --limit and the recap name hosts, and which checks run side by side."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from gpunode import derive, inventory
from gpunode.checks.run import check_groups
from gpunode.hostfile import HostFile, load
from gpunode.derive.plan import router_plan
from gpunode.derive import routerimage as router_image
from gpunode.derive import routerspec as router_spec
from gpunode.runner import failed_hosts
from fakes.refusals import problems  # tests/ is on the path (tests/unit/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "inventory" / "lab" / "fleet.yml"


@pytest.fixture(scope="module")
def fleet() -> HostFile:
    return load(FLEET)


def variant(tmp_path: Path, change) -> Path:
    data = yaml.safe_load(FLEET.read_text())
    change(data)
    path = tmp_path / "fleet.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_lab_fleet_is_two_hosts_and_a_router_on_the_first(fleet: HostFile) -> None:
    assert [h.name for h in fleet.hosts] == ["pve-lab1", "pve-lab2"]
    assert fleet.router is not None and fleet.router_host is fleet.hosts[0]
    assert [h.api.url for h in fleet.hosts] == ["https://127.0.0.4:8006", "https://127.0.0.3:8006"]


def test_the_router_is_derived_once_with_every_host_as_a_worker(fleet: HostFile) -> None:
    derived = derive.derive_router(fleet)
    assert derived is not None
    assert [(w.host, w.node, w.url) for w in derived.workers] == [
        ("pve-lab1", "pve-lab1-ct202", "http://10.0.3.14:30000"), ("pve-lab2", "pve-lab2-ct201", "http://10.0.3.12:30000")]
    argv = list(derived.argv)
    assert argv[argv.index("--worker-urls") + 1:argv.index("--policy=round_robin")] == [w.url for w in derived.workers]
    # Every other value inside its flag's own argument; the key comes from a file inside the container.
    assert [a for a in argv if not a.startswith("--")] == [w.url for w in derived.workers]
    assert not [a for a in argv if a.startswith("--api-key")]
    assert derived.reach.address == "10.0.3.14" and derived.url == "http://10.0.3.14:30080"
    assert derived.image_tag.startswith("gpunode/sglang-router:0.3.2-")
    assert derived.bench_image == derive.server_image(fleet.hosts[0]) and derived.model_dir == "/models/GLM-5-NVFP4"


def test_a_host_file_without_a_router_derives_none() -> None:
    assert derive.derive_router(load(ROOT / "inventory" / "lab" / "host.yml")) is None


def test_the_inventory_carries_the_router_as_data_once(fleet: HostFile) -> None:
    key = Path("/var/lib/gpunode-lab/fleet/api-key")
    built = inventory.build(fleet, {("router", "api_key"): key})
    children = built["all"]["children"]
    assert sorted(children) == ["gpu_nodes", "pve_hosts", "routers"]
    assert sorted(children["gpu_nodes"]["hosts"]) == ["pve-lab1-ct202", "pve-lab2-ct201"]
    router = children["routers"]["hosts"]["router"]
    assert router["ansible_host"] == "10.0.3.14"
    assert set(k for k in router if k.startswith("gpunode_")) == {"gpunode_router", "gpunode_derived", "gpunode_secrets"}
    assert router["gpunode_derived"] == derive.derive_router(fleet).model_dump(mode="json")
    assert router["gpunode_secrets"] == {"api_key_file": str(key)}
    # Names, never values: the key's file path is there, not what it holds.
    assert "api_key" in json.dumps(router["gpunode_router"]) and str(key) in json.dumps(router)


def test_limit_names_hosts_of_the_file_and_brings_their_node_and_the_router(fleet: HostFile) -> None:
    assert inventory.limit_pattern(fleet, "pve-lab2") == "pve-lab2,pve-lab2-ct201,router"
    assert inventory.limit_pattern(fleet, "pve-lab2-ct201") == "pve-lab2-ct201"  # an Ansible pattern as it is
    assert inventory.limit_pattern(fleet, None) is None
    single = load(ROOT / "inventory" / "lab" / "host.yml")
    assert inventory.limit_pattern(single, "pve-lab") == "pve-lab,pve-lab-ct200"


def test_the_recap_names_failed_hosts_in_the_files_words(fleet: HostFile) -> None:
    assert failed_hosts(fleet, {"pve-lab2-ct201"}) == ["pve-lab2"]
    assert failed_hosts(fleet, {"pve-lab2", "pve-lab2-ct201", "router"}) == ["pve-lab2", "router"]
    assert failed_hosts(fleet, {"localhost"}) == []


def test_checks_run_per_host_and_for_the_router(fleet: HostFile) -> None:
    assert check_groups(fleet, ["host", "router"]) == [
        ("pve-lab1", ["pve-lab1", "pve-lab1-ct202"]), ("pve-lab2", ["pve-lab2", "pve-lab2-ct201"]), ("router", ["router"])]
    assert check_groups(fleet, ["router"]) == [("router", ["router"])]
    assert check_groups(fleet, ["node"]) == [("pve-lab1", ["pve-lab1", "pve-lab1-ct202"]), ("pve-lab2", ["pve-lab2", "pve-lab2-ct201"])]


def test_plan_shows_the_router(fleet: HostFile) -> None:
    shown = router_plan(fleet)
    assert shown is not None
    assert [w["url"] for w in shown["workers"]] == ["http://10.0.3.14:30000", "http://10.0.3.12:30000"]
    assert "--api-key from the key file" in shown["command"] and "pve-lab1's GPU node" in shown["runs_on"]
    assert router_plan(load(ROOT / "inventory" / "lab" / "host.yml")) is None


@pytest.mark.parametrize(("name", "change", "expected"), [
    ("unknown-host", lambda d: d["router"].update(runs_on="pve-nope"),
     r"^router\.runs_on: 'pve-nope' is not a host of this file \(pve-lab1, pve-lab2\) \(line \d+\)$"),
    ("loopback-server", lambda d: [d["hosts"][1]["server"].update(bind="127.0.0.1")],
     r"^hosts\[1\]\.server\.bind: 127\.0\.0\.1: the router cannot reach a server on loopback"),
    ("other-key", lambda d: d["hosts"][1]["server"].update(api_key={"env": "OTHER_KEY"}),
     r"^hosts\[1\]\.server\.api_key: the router sends its one key to every worker: give the same secret as router\.api_key"),
    ("other-model", lambda d: d["hosts"][1]["model"].update(served_name="glm-x"),
     r"^hosts\[1\]\.model\.served_name: 'glm-x': the router serves one model, and hosts\[0\] serves 'glm-5'"),
    ("port-taken", lambda d: d["router"].update(port=30000),
     r"^router\.port: 30000 is taken on pve-lab1's node by its server"),
    ("exposed-without-key", lambda d: [d["router"].pop("api_key")] + [h["server"].pop("api_key") for h in d["hosts"]],
     r"^router: bind 0\.0\.0\.0 is reachable from other machines: set api_key"),
    ("manual-policy", lambda d: d["router"].update(policy="manual"), r"^router\.policy: must be "),
    ("host-named-router", lambda d: d["hosts"][1].update(name="router"),
     r"^hosts\[1\]\.name: 'router' is the router's own name in gpunode's inventory"),
    ("python-3.12-base", lambda d: d["router"]["image"].update(base="ubuntu:24.04"),
     r"^router\.image\.base: ubuntu:24\.04 has Python 3\.12; the router's lock is for 3\.11"),
])
def test_a_bad_router_is_one_line_naming_where(tmp_path: Path, name: str, change, expected: str) -> None:
    found = problems(variant(tmp_path, change))
    assert any(re.search(expected, line) for line in found), found


def test_a_bare_on_key_says_what_yaml_made_of_it(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yml"
    path.write_text(FLEET.read_text().replace("  runs_on: pve-lab1", "  on: pve-lab1"))
    found = problems(path)
    # YAML 1.2 (gpunode.ground.yamlsource) reads 'on' as text, no longer as true: an unknown key, with its fix.
    assert any("router.on: unknown key (did you mean 'runs_on'?)" in line for line in found), found


def test_the_router_container_never_holds_the_key_and_is_labelled_as_gpunodes() -> None:
    argv = router_spec.router_argv(30080, ["http://10.0.3.14:30000"], "cache_aware", 10)
    spec = router_spec.container_spec(image="gpunode/sglang-router:x", argv=argv, bind="0.0.0.0", port=30080,
                                      metrics_port=29000)
    assert spec["labels"]["io.gpunode.role"] == router_spec.ROLE
    assert spec["ports"] == {"30080/tcp": ("0.0.0.0", 30080), "29000/tcp": ("127.0.0.1", 29000)}
    again = router_spec.container_spec(image="gpunode/sglang-router:x", argv=argv, bind="0.0.0.0", port=30080,
                                       metrics_port=29000)
    assert again["labels"] == spec["labels"]  # same settings, same hash: a running router is kept
    other = router_spec.container_spec(image="gpunode/sglang-router:x", argv=argv + ["--x"], bind="0.0.0.0",
                                       port=30080, metrics_port=29000)
    assert other["labels"]["io.gpunode.config-hash"] != spec["labels"]["io.gpunode.config-hash"]


def test_the_router_image_is_hash_locked_and_tagged_by_content() -> None:
    lock = (router_image.FOLDER / "requirements.lock").read_text()
    pins = re.findall(r"^([a-z0-9-]+)==(\S+) \\$", lock, re.M)
    assert ("sglang-router", "0.3.2") in pins
    blocks = re.split(r"\n(?=[a-z0-9-]+==)", lock.split("\n", 2)[2])
    assert len(blocks) == len(pins) and all("--hash=sha256:" in block for block in blocks)
    inputs = router_image.collect("debootstrap", None)
    assert "--require-hashes" in inputs.dockerfile and "--only-binary=:all:" in inputs.dockerfile
    assert inputs.tag == router_image.collect("debootstrap", None).tag
    assert inputs.tag != router_image.collect("debian:bookworm-slim", None).tag
    assert "apt-get install" in router_image.collect("debian:bookworm-slim", None).dockerfile
    assert "apt-get install" not in inputs.dockerfile  # the debootstrap base has the packages already


def test_the_recap_says_which_hosts_to_re_run() -> None:
    import io

    from rich.console import Console

    from gpunode.runner import Failure, RunSummary, print_recap

    summary = RunSummary("id", "failed", 2, 1, ["host"], False, None,
                         {"ok": {"pve-lab1": 3, "pve-lab2": 1}, "failures": {"pve-lab2": 1}},
                         [Failure("pve-lab2", "Converge the GPU container", "unreachable: Proxmox API down")],
                         failed_hosts=["pve-lab2"])
    out = io.StringIO()
    print_recap(summary, Console(file=out, width=200, color_system=None))
    assert "failed hosts: pve-lab2 (re-run just those: --limit pve-lab2)" in out.getvalue().splitlines()


def test_check_runs_the_hosts_side_by_side_and_names_each(gpunode, tmp_path: Path) -> None:
    """Two hosts, every address on loopback and every SSH port closed: each host's checks run in a
    pytest of their own, and the merged report names all four machines, each once."""
    from copy import deepcopy

    from test_check_output import loopback_hosts

    data = yaml.safe_load(loopback_hosts(tmp_path).read_text())
    second = deepcopy(data["hosts"][0])
    second["name"] = "pve2"
    # Its own hostname too: both containers are on node pve1 of the one API, where one hostname
    # twice is refused (hostfile._collisions).
    second["container"].update(vmid=201, hostname="glm5-b", ssh={**second["container"]["ssh"], "address": "127.0.0.7"})
    second["container"]["network"]["ip"] = "127.0.0.7/8"
    data["hosts"].append(second)
    path = tmp_path / "two.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = gpunode("check", str(path), timeout=300, env={"PVE_ROOT_PASSWORD": "not-used"})
    assert result.returncode == 3, result.stdout + result.stderr
    unreachable = [line.split(":")[0] for line in result.stdout.splitlines() if line.startswith("UNREACHABLE")]
    assert unreachable == ["UNREACHABLE pve1", "UNREACHABLE pve1-ct200", "UNREACHABLE pve2", "UNREACHABLE pve2-ct201"]


def test_a_router_on_a_machine_of_its_own(tmp_path: Path) -> None:
    """runs_on an SSH address: the router machine is reached there, carries no server image, and the
    smoke checks through it run without the bench (that needs a node with the server image)."""
    path = variant(tmp_path, lambda d: d["router"].update(runs_on={
        "address": "10.0.3.20", "key_file": "/var/lib/gpunode-lab/ssh/id_ed25519",
        "known_hosts": "/var/lib/gpunode-lab/ssh/known_hosts"}))
    fleet = load(path)
    assert fleet.router_host is None
    routed = derive.derive_router(fleet)
    assert routed is not None and routed.runs_on is None and routed.reach.address == "10.0.3.20"
    assert routed.url == "http://10.0.3.20:30080" and routed.bench_image is None and routed.model_dir is None
    router = inventory.build(fleet, {})["all"]["children"]["routers"]["hosts"]["router"]
    assert router["ansible_host"] == "10.0.3.20" and router["gpunode_derived"]["runs_on"] is None
    assert "a machine of its own" in router_plan(fleet)["runs_on"]
