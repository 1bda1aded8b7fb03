"""The p2p verdict's fabric causes (issue #35, item 3): the measurements and the Proxmox host's PCIe
fabric facts together name acs, bar1 and p2p_mode; incomplete facts name nothing but themselves.

The nodes are test_p2p_verdict's (the recorded H200 cloned into two GPUs); the fabrics are built by
tests/fakes/fabric.py after the PCIe Base Specification and read by the real pci_fabric.gather, and
the H200 machine's own recording (one GPU on the root bus, config space read as root) stands for a
fabric with nothing to blame. Bandwidths: FIELD-NOTES s1 (53 GB/s healthy same-NUMA, about half
with ACS redirecting through the root complex, rtx6kpro hardware/topology.md).
"""

from __future__ import annotations

import copy
import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakes.fabric import ACS_OFF, REQ_REDIR_CMPLT, direct_pair, flat_switches, root_switch, switch_pair  # noqa: E402
from gpunode.ansible_collections.gpunode.core.plugins.module_utils import pci_fabric  # noqa: E402
from gpunode.ground import exitcodes  # noqa: E402
from gpunode.stages.p2p import __main__ as p2p_main  # noqa: E402
from gpunode.stages.p2p import fabric as pcie_fabric  # noqa: E402
from gpunode.stages.p2p import stage as p2p_stage  # noqa: E402
from gpunode.stages.p2p import verdict  # noqa: E402
from gpunode.stages.p2p.topology import Topology  # noqa: E402
from gpunode.stages.p2p.verdict import Expectations  # noqa: E402
from test_p2p_verdict import PIX, SAME_NUMA_UNI, measured, node  # noqa: E402

HALVED = 26.0  # about half of 53 GB/s: what ACS redirect leaves a same-switch pair
KEYS = {"RegistryDwords": pci_fabric.P2P_REGISTRY_DWORDS}


def on(topology: Topology, addresses: list[str]) -> Topology:
    """The node's GPUs at the fabric's addresses, as NVML writes them (an 8-digit domain)."""
    for gpu, address in zip(topology.gpus, addresses, strict=True):
        gpu.pci_bus_id = "0000" + address.upper()
    return topology


def fabric_of(root: Path, params: dict[str, str] | None = None) -> dict[str, Any]:
    facts = pci_fabric.gather(str(root))
    if params is not None:  # the nvidia module loaded, with these parameters
        facts["driver_params"] = {"RegistryDwords": "", **params}
        facts["registry_dwords"] = pci_fabric.registry_dwords(facts["driver_params"]["RegistryDwords"])
    return facts


def judged(topology: Topology, uni: float, fabric: dict[str, Any] | None, required: bool = True) -> verdict.Verdict:
    return verdict.judge(topology, measured((uni, uni), uni * 1.9), Expectations(required=required), fabric=fabric)


def finding(result: verdict.Verdict, code: str) -> verdict.Finding:
    found = [f for f in result.findings if f.code == code]
    assert len(found) == 1, [f.code for f in result.findings]
    return found[0]


def test_a_halved_same_switch_pair_under_acs_redirect_is_named_acs_with_its_ports(tmp_path: Path) -> None:
    gpus = switch_pair(tmp_path, acs=REQ_REDIR_CMPLT)
    result = judged(on(node(level=PIX), gpus), HALVED, fabric_of(tmp_path, KEYS))
    acs = finding(result, "acs")
    assert acs.severity == "fail" and acs.subject == "node" and acs.category == "p2p"
    assert "0000:02:08.0 (ReqRedir+ CmpltRedir+)" in acs.message and "0000:02:10.0" in acs.message
    assert "GPU0->GPU1" in acs.message and "GPU1->GPU0" in acs.message
    assert "prepare.clear_acs" in (acs.fix or "")
    assert all("acs" in pair.reasons for pair in result.pairs)
    below = [f for f in result.findings if f.code == "below-expectation"]
    assert below and all((f.cause or "").startswith("acs: ") for f in below)
    assert result.exit_code == exitcodes.FAILED


def test_the_same_pair_with_acs_off_is_not_blamed_on_acs(tmp_path: Path) -> None:
    """Halved with ACS off: something else (the generic causes), never acs."""
    gpus = switch_pair(tmp_path, acs=ACS_OFF)
    result = judged(on(node(level=PIX), gpus), HALVED, fabric_of(tmp_path, KEYS))
    assert "acs" not in [f.code for f in result.findings]
    assert all("acs" not in pair.reasons for pair in result.pairs) and result.exit_code == exitcodes.FAILED


def test_acs_redirect_on_a_healthy_pair_is_no_cause(tmp_path: Path) -> None:
    """The verdict names what explains a measurement; the host stage names the setting itself."""
    gpus = switch_pair(tmp_path, acs=REQ_REDIR_CMPLT)
    result = judged(on(node(level=PIX), gpus), SAME_NUMA_UNI, fabric_of(tmp_path, KEYS))
    assert result.exit_code == exitcodes.OK and not [c for c in pcie_fabric.CAUSES
                                                     if c in [f.code for f in result.findings]]


def test_a_failing_pair_with_the_legacy_bar1_is_named_bar1(tmp_path: Path) -> None:
    gpus = switch_pair(tmp_path, acs=ACS_OFF, bar1_bytes=pci_fabric.LEGACY_BAR1)
    result = judged(on(node(level=PIX), gpus), HALVED, fabric_of(tmp_path, KEYS))
    bar1 = finding(result, "bar1")
    assert bar1.severity == "fail" and "GPU0 256 MiB" in bar1.message and "Resizable BAR" in (bar1.fix or "")
    assert all("bar1" in pair.reasons for pair in result.pairs)


def test_direct_attached_pairs_without_the_registry_keys_are_a_p2p_mode_warning(tmp_path: Path) -> None:
    """Healthy numbers, yet the driver stages kernel-level P2P through memory: a warning, which
    cudaMemcpy peer copies cannot show (rtx6kpro optimization/pcie-oneshot-allreduce.md)."""
    gpus = direct_pair(tmp_path)
    result = judged(on(node(), gpus), SAME_NUMA_UNI, fabric_of(tmp_path, {}))
    mode = finding(result, "p2p_mode")
    assert mode.severity == "warn" and "ForceP2P=0x11" in mode.message and "do not show it" in (mode.cause or "")
    assert "prepare.p2p_registry" in (mode.fix or "")
    assert result.exit_code == exitcodes.OK and all("p2p_mode" in pair.reasons for pair in result.pairs)


def test_direct_attached_pairs_with_the_keys_loaded_pass_quietly(tmp_path: Path) -> None:
    gpus = direct_pair(tmp_path)
    result = judged(on(node(), gpus), SAME_NUMA_UNI, fabric_of(tmp_path, KEYS))
    assert "p2p_mode" not in [f.code for f in result.findings] and result.exit_code == exitcodes.OK


def test_p2p_mode_is_not_said_of_pairs_under_one_switch(tmp_path: Path) -> None:
    gpus = switch_pair(tmp_path, acs=ACS_OFF)
    result = judged(on(node(level=PIX), gpus), SAME_NUMA_UNI, fabric_of(tmp_path, {}))
    assert "p2p_mode" not in [f.code for f in result.findings]


def test_without_the_module_loaded_p2p_mode_is_not_guessed(tmp_path: Path) -> None:
    gpus = direct_pair(tmp_path)
    result = judged(on(node(), gpus), SAME_NUMA_UNI, fabric_of(tmp_path))  # no /proc/driver/nvidia/params
    assert "p2p_mode" not in [f.code for f in result.findings]


def test_not_required_demotes_the_fabric_causes_with_the_pairs(tmp_path: Path) -> None:
    gpus = switch_pair(tmp_path, acs=REQ_REDIR_CMPLT)
    result = judged(on(node(level=PIX), gpus), HALVED, fabric_of(tmp_path, KEYS), required=False)
    assert finding(result, "acs").severity == "warn" and result.exit_code == exitcodes.OK


@pytest.mark.parametrize("damage", ["short-config", "missing-gpu", "no-gpus"])
def test_incomplete_facts_name_no_cause_and_say_so(tmp_path: Path, damage: str) -> None:
    """Read without root (64 bytes of config space, as inside a container), facts of another machine,
    or no sysfs: fabric-unread, an info, and no acs however the numbers look."""
    gpus = switch_pair(tmp_path, acs=REQ_REDIR_CMPLT)
    facts = fabric_of(tmp_path, KEYS)
    if damage == "short-config":
        facts["gpus"][0]["parents"][-1].update(config_bytes=64, port_type=None, acs=None)
    elif damage == "missing-gpu":
        facts["gpus"] = facts["gpus"][:1]
    else:
        facts["gpus"] = []
    result = judged(on(node(level=PIX), gpus), HALVED, facts)
    unread = finding(result, "fabric-unread")
    assert unread.severity == "info" and "not judged" in unread.message
    assert not [f for f in result.findings if f.code in pcie_fabric.CAUSES]


def test_without_fabric_facts_the_verdict_is_as_before(tmp_path: Path) -> None:
    gpus = switch_pair(tmp_path, acs=REQ_REDIR_CMPLT)
    result = judged(on(node(level=PIX), gpus), HALVED, None)
    assert not [f for f in result.findings if f.code in (*pcie_fabric.CAUSES, "fabric-unread")]


def test_the_h200_recording_has_nothing_to_blame(tmp_path: Path) -> None:
    """The H200 machine's own fabric (a VM, one GPU on the root bus, read as root): complete facts;
    with its one GPU there is no pair and no cause."""
    recording = Path(__file__).resolve().parents[1] / "fixtures" / "host" / "h200" / "fabric" / "fabric-sysroot.tar.gz"
    with tarfile.open(recording) as tar:
        tar.extractall(tmp_path, filter="data")
    facts = pci_fabric.gather(str(tmp_path / "sysroot"))
    topology = node()
    address = facts["gpus"][0]["address"]
    topology.gpus[0].pci_bus_id = "0000" + address.upper()
    topology.gpus, topology.pairs = topology.gpus[:1], []
    assert pcie_fabric.unread(facts, topology) is None
    assert pcie_fabric.causes(facts, topology, [], []) == []


def test_nvml_bus_ids_map_to_sysfs_addresses() -> None:
    assert pcie_fabric.fabric_address("00000000:C1:00.0") == "0000:c1:00.0"
    assert pcie_fabric.fabric_address("0000:41:00.0") == "0000:41:00.0"


# -- the stand-alone check's --fabric-file ------------------------------------------------------

@pytest.mark.parametrize("content, wrong", [
    (b"{", "not JSON"),
    (b"[1, 2]", "not fabric facts"),
    (b'{"gpus": [{"parents": []}]}', "not fabric facts"),
    (b'{"gpus": "many"}', "not fabric facts"),
    (b"\xff\xfe", "not JSON"),
])
def test_a_bad_fabric_file_is_bad_input_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        content: bytes, wrong: str) -> None:
    path = tmp_path / "fabric.json"
    path.write_bytes(content)
    assert p2p_main.main(["--fabric-file", str(path)]) == exitcodes.BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith(f"error: --fabric-file {path}: {wrong}") and err.count("\n") == 1


def test_a_fabric_file_that_is_not_a_file_or_too_large_is_refused(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert p2p_main.main(["--fabric-file", str(tmp_path)]) == exitcodes.BAD_INPUT
    assert "not a regular file" in capsys.readouterr().err
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (p2p_main.MAX_FABRIC_BYTES + 1))
    assert p2p_main.main(["--fabric-file", str(big)]) == exitcodes.BAD_INPUT
    assert "larger than" in capsys.readouterr().err


def test_the_fabric_file_takes_the_facts_module_output_or_the_fabric_alone(tmp_path: Path) -> None:
    gpus = switch_pair(tmp_path / "sys", acs=REQ_REDIR_CMPLT)
    facts = fabric_of(tmp_path / "sys", KEYS)
    for data in (facts, {"fabric": facts, "gpus": "the host facts' own list"}):
        path = tmp_path / "fabric.json"
        path.write_text(json.dumps(data))
        assert [g["address"] for g in p2p_main.fabric_facts(path)["gpus"]] == gpus


def test_the_stage_ships_the_fabric_reader_and_the_facts_and_records_the_causes(tmp_path: Path) -> None:
    """In the image: pci_fabric beside the p2p package, fabric.json when the play read it; the
    node's record carries the causes with their fixes for `gpunode check`."""
    facts = {"gpus": [], "driver_params": {}, "registry_dwords": {}, "link_power": {}}
    with tarfile.open(fileobj=io.BytesIO(p2p_stage.archive(facts))) as tar:
        names = tar.getnames()
        shipped = json.load(tar.extractfile(p2p_stage.FABRIC_FILE))  # type: ignore[arg-type]
    assert f"gpunode/{p2p_stage.PCI_FABRIC}" in names and "gpunode/stages/p2p/fabric.py" in names
    assert shipped == facts
    with tarfile.open(fileobj=io.BytesIO(p2p_stage.archive())) as tar:
        assert p2p_stage.FABRIC_FILE not in tar.getnames()
    gpus = switch_pair(tmp_path, acs=REQ_REDIR_CMPLT)
    result = judged(on(node(level=PIX), gpus), HALVED, fabric_of(tmp_path, KEYS))
    from dataclasses import asdict

    record = p2p_stage.record([0, 1], result.exit_code, asdict(result))
    assert not record["ok"] and len(record["causes"]) == 1
    assert record["causes"][0].startswith("FAIL node acs: ACS redirects") and "-> set prepare.clear_acs" in record["causes"][0]



@pytest.mark.parametrize("bridge", [{"port_type": "root port"}, {"address": 7, "config_bytes": 4096},
                                    {"address": "0000:00:01.0", "config_bytes": "4096", "port_type": "root port"},
                                    {"address": "0000:00:01.0", "config_bytes": 4096, "port_type": "root port",
                                     "acs": ["ReqRedir"]}])
def test_facts_that_are_not_pci_fabrics_are_unread_not_a_crash(tmp_path: Path, bridge: dict[str, Any]) -> None:
    gpus = switch_pair(tmp_path, acs=REQ_REDIR_CMPLT)
    facts = fabric_of(tmp_path, KEYS)
    facts["gpus"][1]["parents"][0] = bridge
    result = judged(on(node(level=PIX), gpus), HALVED, facts)
    assert "not pci_fabric's" in finding(result, "fabric-unread").message


def test_the_play_reads_only_the_fabric_on_the_proxmox_host(tmp_path: Path) -> None:
    """nvidia_host_facts with gather_subset=fabric, as the p2p role calls it: the fabric and nothing
    else, the same facts the host stage reads (the H200 recording as the host's root)."""
    from test_module_failures import run_module

    recording = Path(__file__).resolve().parents[1] / "fixtures" / "host" / "h200" / "fabric" / "fabric-sysroot.tar.gz"
    with tarfile.open(recording) as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "sysroot"
    result = run_module("nvidia_host_facts", {"facts_root": str(root), "gather_subset": "fabric"}, tmp_path)
    assert not result["failed"] and list(result["facts"]) == ["fabric"]
    assert result["facts"]["fabric"] == json.loads(json.dumps(pci_fabric.gather(str(root))))
    refused = run_module("nvidia_host_facts", {"gather_subset": "kernels"}, tmp_path)
    assert refused["failed"] and "gather_subset" in refused["msg"]


def gpus_at(addresses: list[str]) -> Topology:
    """A node of len(addresses) GPUs cloned from the recorded one, at those addresses, no pairs."""
    topology = node()
    first = topology.gpus[0]
    topology.gpus = []
    for index, address in enumerate(addresses):
        gpu = copy.deepcopy(first)
        gpu.index, gpu.pci_bus_id = index, "0000" + address.upper()
        topology.gpus.append(gpu)
    topology.pairs = []
    return topology


@pytest.mark.parametrize("build, expected", [
    (lambda root: flat_switches(root, switches=3), 3),  # each switch: its two GPUs to the two other roots
    (lambda root: flat_switches(root, switches=4), 4),
    (lambda root: flat_switches(root, switches=2), 0),  # one other root only: the control case
    (lambda root: flat_switches(root, switches=3, per_switch=1), 0),  # one GPU per switch: one writer
    (lambda root: root_switch(root), 0),  # a root switch above: traffic never reaches a CPU root port
    (switch_pair, 0), (direct_pair, 0),
])
def test_the_write_collapse_pattern_is_named_from_the_fabric_alone(tmp_path: Path, build: Any, expected: int) -> None:
    """collapse-report.md lines 219-235: two or more GPUs of one switch writing concurrently to GPUs
    behind two or more different root ports; not one writer, not one destination root, not under a
    root switch. A warning: the pair-at-a-time matrix cannot show it."""
    addresses = build(tmp_path)
    facts = fabric_of(tmp_path, KEYS)
    topology = gpus_at(addresses)
    found = [f for f in pcie_fabric.causes(facts, topology, [], []) if f.code == "write_collapse"]
    assert len(pcie_fabric.collapse_switches(facts["gpus"])) == expected
    if expected:
        [collapse] = found
        assert collapse.severity == "warn" and "collapse-report.md" in (collapse.cause or "")
        assert "cannot show it" in (collapse.cause or "") and "ring all-reduce" in (collapse.fix or "")
    else:
        assert found == []


def test_the_h200_machine_s_own_run_read_its_fabric_whole() -> None:
    """Recorded on the device tool's H200 (a VM, root, one GPU on the root bus at 0000:00:06.0, BAR1
    256 GiB): pci_fabric.gather('/') read the config space whole, and the stand-alone check given it
    with --fabric-file judged it with no fabric finding at all (nothing unread, nothing to blame)."""
    folder = Path(__file__).resolve().parents[1] / "fixtures" / "p2p" / "h200-fabric"
    facts = json.loads((folder / "fabric.json").read_text())
    [gpu] = facts["gpus"]
    assert gpu["config_bytes"] == 4096 and gpu["port_type"] == "endpoint" and gpu["parents"] == []
    assert gpu["bar1_bytes"] == 256 * 2**30 > pci_fabric.LEGACY_BAR1
    assert facts["driver_params"]["RegistryDwords"] == "" and pci_fabric.missing_p2p_keys(facts["registry_dwords"])
    report = json.loads((folder / "p2p-fabric-file.json").read_text())
    codes = [f["code"] for f in report["verdict"]["findings"]]
    assert report["verdict"]["exit_code"] == exitcodes.NOT_APPLICABLE
    assert not set(codes) & {*pcie_fabric.CAUSES, "fabric-unread"}
    topology = gpus_at([gpu["address"]])
    assert pcie_fabric.unread(facts, topology) is None


# -- what the red team found (each was a crash or a wrong cause) ---------------------------------

@pytest.mark.parametrize("content", [b"[" * 100000 + b"]" * 100000, b'{"gpus": [], "registry_dwords": "ForceP2P=0x11"}',
                                     b'{"gpus": [], "driver_params": [1]}'])
def test_deep_or_mistyped_fabric_files_are_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     content: bytes) -> None:
    path = tmp_path / "fabric.json"
    path.write_bytes(content)
    assert p2p_main.main(["--fabric-file", str(path)]) == exitcodes.BAD_INPUT
    assert capsys.readouterr().err.startswith(f"error: --fabric-file {path}: not ")


@pytest.mark.parametrize("fabric", [[], "x", 5, {"gpus": "many"}, {"gpus": [], "registry_dwords": "ForceP2P=0x11"}])
def test_judge_given_no_fabric_mapping_says_unread(tmp_path: Path, fabric: Any) -> None:
    gpus = switch_pair(tmp_path)
    result = judged(on(node(level=PIX), gpus), HALVED, fabric)
    assert finding(result, "fabric-unread").severity == "info"


@pytest.mark.parametrize("parents", ["0000:01:00.0", 5, {"address": "0000:01:00.0"}])
def test_a_chain_that_is_not_a_list_of_bridges_is_unread(tmp_path: Path, parents: Any) -> None:
    gpus = switch_pair(tmp_path, acs=REQ_REDIR_CMPLT)
    facts = fabric_of(tmp_path, KEYS)
    facts["gpus"][0]["parents"] = parents if not isinstance(parents, str) else [parents, *facts["gpus"][0]["parents"]]
    result = judged(on(node(level=PIX), gpus), HALVED, facts)
    assert "not pci_fabric's" in finding(result, "fabric-unread").message


@pytest.mark.parametrize("size", [True, -1, 0, "256"])
def test_a_bar1_that_is_no_size_is_never_the_legacy_window(tmp_path: Path, size: Any) -> None:
    gpus = switch_pair(tmp_path, acs=ACS_OFF)
    facts = fabric_of(tmp_path, KEYS)
    facts["gpus"][0]["bar1_bytes"] = size
    assert "bar1" not in [f.code for f in judged(on(node(level=PIX), gpus), HALVED, facts).findings]


def test_nvlink_pairs_are_neither_p2p_mode_nor_write_collapse(tmp_path: Path) -> None:
    """An HGX-like box: GPUs on separate root ports (or flat switches) joined by NVLink."""
    gpus = direct_pair(tmp_path)
    result = judged(on(node(nvlinks=12), gpus), 150.0, fabric_of(tmp_path, {}))
    assert [p.link_class for p in result.pairs] == ["nvlink", "nvlink"]
    assert not [f for f in result.findings if f.code in ("p2p_mode", "write_collapse")]
    flat = tmp_path / "flat"
    addresses = flat_switches(flat, switches=4)
    topology = gpus_at(addresses)
    pairs = [verdict.PairVerdict(src=a, dst=b, link_class="nvlink", legend="NV18", expected_gbps=100.0,
                                 measured_gbps=150.0, bidir_gbps=None, latency_us=None, path="p2p", status="pass")
             for a in range(len(addresses)) for b in range(len(addresses)) if a != b]
    assert not [f for f in pcie_fabric.causes(fabric_of(flat, KEYS), topology, pairs, []) if f.code == "write_collapse"]


def test_acs_below_the_turning_switch_is_not_blamed(tmp_path: Path) -> None:
    """A root switch above two leaf switches, ReqRedir only on the leaf switches' downstream ports:
    a pair across the leaves turns in the root switch, whose ports are clear; not acs."""
    addresses = root_switch(tmp_path, switches=2, per_switch=1)
    facts = fabric_of(tmp_path, KEYS)
    for gpu in facts["gpus"]:
        gpu["parents"][-1]["acs"] = {"SrcValid": True, "ReqRedir": True, "CmpltRedir": True}
    result = judged(on(node(level=PIX), addresses), HALVED, facts)
    assert "acs" not in [f.code for f in result.findings]
    for gpu in facts["gpus"]:  # the root switch's own downstream ports redirecting: that is acs
        gpu["parents"][2]["acs"] = {"SrcValid": True, "ReqRedir": True, "CmpltRedir": True}
    assert "0000:02:00.0 (ReqRedir+ CmpltRedir+)" in finding(judged(on(node(level=PIX), addresses), HALVED, facts),
                                                              "acs").message


def test_the_keys_as_module_parameters_or_in_decimal_count_as_in_effect(tmp_path: Path) -> None:
    gpus = direct_pair(tmp_path)
    params = {"RegistryDwords": "ForceP2P=17;RMForceP2PType=1;RMPcieP2PType=2", "GrdmaPciTopoCheckOverride": "1",
              "EnableResizableBar": "1"}
    result = judged(on(node(), gpus), SAME_NUMA_UNI, fabric_of(tmp_path, params))
    assert "p2p_mode" not in [f.code for f in result.findings]


def test_another_gpu_of_the_host_does_not_hide_the_causes(tmp_path: Path) -> None:
    """A GPU of the host that this container does not measure (off the bus, config unread) is not judged."""
    gpus = switch_pair(tmp_path, acs=REQ_REDIR_CMPLT)
    facts = fabric_of(tmp_path, KEYS)
    facts["gpus"].append({"address": "0000:81:00.0", "parents": [], "port_type": None, "config_bytes": 0})
    assert finding(judged(on(node(level=PIX), gpus), HALVED, facts), "acs").severity == "fail"


def test_a_real_switch_machine_s_gpu_reads_the_same_in_lspci_sysfs_and_nvidia_smi(tmp_path: Path) -> None:
    """The ASUS ESC8000A-E13P's GPU 06:00.0 (rtx6kpro logs/asus-report, tests/fixtures/host/fabric/
    SOURCE.md): its lspci regions written as sysfs ``resource`` lines give the BAR1 nvidia-smi -q
    reports (131072 MiB), the bus id NVML gives maps to its sysfs address, and on that BAR1 neither
    the host stage nor the verdict names bar1 (its pair's trouble is elsewhere)."""
    import re

    from gpunode.stages.host.fabric import check_bar1

    folder = Path(__file__).resolve().parents[1] / "fixtures" / "host" / "fabric"
    lspci = (folder / "asus-gpu-06-00-0.lspci.txt").read_text()
    smi = (folder / "asus-gpu-06-00-0.nvidia-smi-q.txt").read_text()
    units = {"M": 2**20, "G": 2**30}
    registers = ["0x0000000000000000 0x0000000000000000 0x0000000000000000"] * 6
    for number, start, size, unit in re.findall(r"Region (\d): Memory at ([0-9a-f]+) .*\[size=(\d+)([MG])\]", lspci):
        begin = int(start, 16)
        registers[int(number)] = f"0x{begin:016x} 0x{begin + int(size) * units[unit] - 1:016x} 0x000000000014220c"
    bar1 = pci_fabric.bar1_bytes("\n".join(registers) + "\n")
    total = re.search(r"BAR1 Memory Usage\n\s+Total\s+: (\d+) MiB", smi)
    bus = re.search(r"Bus Id\s+: (\S+)", smi)
    assert total and bus and bar1 == int(total.group(1)) * 2**20 == 128 * 2**30
    assert pcie_fabric.fabric_address(bus.group(1)) == "0000:" + lspci.split()[0]
    assert check_bar1({"gpus": [{"address": "0000:06:00.0", "bar1_bytes": bar1}]}).severity == "ok"
    gpus = switch_pair(tmp_path, acs=ACS_OFF, bar1_bytes=bar1)
    assert "bar1" not in [f.code for f in judged(on(node(level=PIX), gpus), HALVED, fabric_of(tmp_path, KEYS)).findings]


def test_a_fabric_file_named_like_an_option_or_holding_escapes_stays_inert(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The path and the addresses in the file reach the terminal only written out: a name with an
    escape sequence or a newline is one inert line; a value that begins with '-' is a path (given
    as --fabric-file=VALUE) or refused by argparse, never another option."""
    odd = tmp_path / "fab\x1b[31mric\n.json"
    odd.write_text("{")
    assert p2p_main.main([f"--fabric-file={odd}"]) == exitcodes.BAD_INPUT
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[31m" in err and "\\n" in err and err.count("\n") == 1
    assert p2p_main.main(["--fabric-file=--json"]) == exitcodes.BAD_INPUT
    assert capsys.readouterr().err == "error: --fabric-file --json: not a regular file\n"
    with pytest.raises(SystemExit) as refused:
        p2p_main.main(["--fabric-file", "--json"])
    assert refused.value.code == exitcodes.BAD_INPUT and "expected one argument" in capsys.readouterr().err
    hostile = tmp_path / "hostile.json"
    hostile.write_text(json.dumps({"gpus": [{"address": "0000:03:00.0\x1b]0;owned\x07", "parents": []}]}))
    assert p2p_main.main(["--fabric-file", str(hostile)]) == exitcodes.BAD_INPUT
    err = capsys.readouterr().err
    assert "not fabric facts (a GPU without a PCI address" in err and "\x1b" not in err


def test_a_bridge_address_that_is_no_pci_address_is_unread_and_never_shown(tmp_path: Path) -> None:
    gpus = switch_pair(tmp_path, acs=REQ_REDIR_CMPLT)
    facts = fabric_of(tmp_path, KEYS)
    facts["gpus"][0]["parents"][-1]["address"] = "0000:02:08.0\x1b[2J"
    result = judged(on(node(level=PIX), gpus), HALVED, facts)
    assert "not pci_fabric's" in finding(result, "fabric-unread").message
    assert not any("\x1b" in (f.message + (f.cause or "")) for f in result.findings)
