"""Pair and node verdicts, exit codes and likely causes (pure logic, no GPU).

No multi-GPU machine was available, so multi-GPU nodes are DERIVED: the recorded H200 reading
(tests/fixtures/p2p/p2p.json) is cloned into a second GPU with another index, UUID and bus id, and
the pair between them gets a topology level and NVML P2P status from the enum in FIELD-NOTES s7.
Pair bandwidths are the public RTX PRO 6000 Gen5 x16 numbers in FIELD-NOTES s1: unidirectional
53-56 GB/s same NUMA, 39-51 across sockets; bidirectional 103-111 / 64-99. The copy latency is not
judged, so no latency number is needed.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from gpunode.stages.p2p import report, verdict
from gpunode.stages.p2p.measure import Bandwidth, DriverProbe, Measurements, PairMeasurements
from gpunode.stages.p2p.topology import Gpu, PairTopology, Topology
from gpunode.stages.p2p.verdict import Expectations

ROOT = Path(__file__).resolve().parents[2]
RECORDED = report.result_from_json(json.loads((ROOT / "tests" / "fixtures" / "p2p" / "p2p.json").read_text()))
SAME_NUMA_UNI, SAME_NUMA_BIDIR = 53.0, 103.0  # FIELD-NOTES s1, public, low end
CROSS_NUMA_UNI, CROSS_NUMA_BIDIR = 39.0, 64.0  # FIELD-NOTES s1, public, low end
SYS, NODE, PIX = 50, 40, 10
OK, CHIPSET_NOT_SUPPORTED, NOT_SUPPORTED = 0, 1, 5


def _gpu(index: int, numa: int | None, virtualization: int) -> Gpu:
    assert RECORDED.topology is not None
    gpu = copy.deepcopy(RECORDED.topology.gpus[0])
    gpu.index = index
    gpu.uuid = gpu.uuid[:-1] + str(index)
    gpu.pci_bus_id = f"00000000:{index + 1:02x}:00.0"
    gpu.numa_node = numa
    gpu.virtualization_mode = virtualization
    gpu.virtualization = {0: "none", 1: "pass-through"}[virtualization]
    return gpu


def _pair(src: int, dst: int, level: int, status: int, nvlinks: int = 0) -> PairTopology:
    names = {OK: "OK", CHIPSET_NOT_SUPPORTED: "CHIPSET_NOT_SUPPORTED", NOT_SUPPORTED: "NOT_SUPPORTED"}
    nvlink_status = OK if nvlinks else NOT_SUPPORTED
    codes: dict[str, int | None] = {"read": status, "write": status, "nvlink": nvlink_status,
                                    "atomics": NOT_SUPPORTED, "pci": status}
    legend = f"NV{nvlinks}" if nvlinks else {SYS: "SYS", NODE: "NODE", PIX: "PIX"}[level]
    return PairTopology(src=src, dst=dst, level=level, legend=legend, nvlinks=nvlinks, p2p_status=codes,
                        p2p_reason={cap: names[code or 0] for cap, code in codes.items()})


def node(numas: tuple[int | None, int | None] = (0, 0), level: int = NODE, status: int = OK,
         virtualization: int = 0, nvlinks: int = 0) -> Topology:
    """Two GPUs derived from the recorded one. virtualization 0: the LXC container on the host."""
    assert RECORDED.topology is not None
    gpus = [_gpu(0, numas[0], virtualization), _gpu(1, numas[1], virtualization)]
    pairs = [_pair(0, 1, level, status, nvlinks), _pair(1, 0, level, status, nvlinks)]
    return Topology(driver_version=RECORDED.topology.driver_version,
                    cuda_driver_version=RECORDED.topology.cuda_driver_version,
                    nvml_version=RECORDED.topology.nvml_version, gpus=gpus, pairs=pairs,
                    host=copy.deepcopy(RECORDED.topology.host))


def _bandwidth(kind: str, src: int, dst: int, gbps: float, path: str, verified: bool = True) -> Bandwidth:
    return Bandwidth(kind=kind, src=f"cuda:{src}", dst=f"cuda:{dst}", bytes_per_copy=512 * 2**20, copies_per_sample=2,
                     samples_gbps=[gbps], median_gbps=gbps, verified=verified,
                     mismatched_elements=0 if verified else 1, seconds=0.2, path=path)


def measured(uni: tuple[float, float], bidir: float, peer_access: bool = True,
             verified: bool = True) -> Measurements:
    """Per-GPU results are the recorded H200's; the pair results carry the given bandwidths."""
    assert RECORDED.measurements is not None
    recorded_gpu = RECORDED.measurements.gpus[0]
    gpus = [dataclasses.replace(copy.deepcopy(recorded_gpu), nvml_index=i, cuda_ordinal=i) for i in (0, 1)]
    path = "p2p" if peer_access else "staged"
    pairs = [PairMeasurements(src=s, dst=d, cuda_src=s, cuda_dst=d, peer_access=peer_access,
                              uni=_bandwidth("p2p", s, d, gbps, path, verified),
                              bidir=_bandwidth("p2p_bidir", s, d, bidir, path))
             for (s, d), gbps in zip(((0, 1), (1, 0)), uni, strict=True)]
    return Measurements(torch_version=RECORDED.measurements.torch_version, cuda_runtime="13.0", cuda_device_count=2,
                        gpus=gpus, pairs=pairs)


def codes(result: verdict.Verdict, severity: str | None = None) -> list[str]:
    return [f.code for f in result.findings if severity is None or f.severity == severity]


def test_same_numa_pair_at_public_speed_passes() -> None:
    result = verdict.judge(node(), measured((SAME_NUMA_UNI, SAME_NUMA_UNI), SAME_NUMA_BIDIR), Expectations())
    assert result.exit_code == verdict.EXIT_PASS and result.status == "pass"
    assert [(p.src, p.dst, p.link_class, p.expected_gbps, p.status) for p in result.pairs] == [
        (0, 1, "same_numa", 45.0, "pass"), (1, 0, "same_numa", 45.0, "pass")]
    assert codes(result, "fail") == [] and "all 2 ordered pairs of 2 GPUs" in result.summary


def test_cross_numa_pair_is_held_to_the_cross_numa_expectation() -> None:
    topology = node(numas=(0, 1), level=SYS)
    passing = verdict.judge(topology, measured((CROSS_NUMA_UNI, CROSS_NUMA_UNI), CROSS_NUMA_BIDIR), Expectations())
    assert passing.exit_code == 0 and {p.link_class for p in passing.pairs} == {"cross_numa"}
    stricter = verdict.judge(topology, measured((CROSS_NUMA_UNI, CROSS_NUMA_UNI), CROSS_NUMA_BIDIR),
                             Expectations(cross_numa_gbps=45))
    assert stricter.exit_code == verdict.EXIT_FAIL
    below = next(f for f in stricter.findings if f.code == "below-expectation")
    assert below.cause and "CPU interconnect between sockets" in below.cause and "SYS" in below.cause


def test_one_slow_direction_fails_that_pair_only_with_causes() -> None:
    result = verdict.judge(node(), measured((SAME_NUMA_UNI, CROSS_NUMA_UNI), SAME_NUMA_BIDIR), Expectations())
    assert result.exit_code == verdict.EXIT_FAIL and "1 of 2 ordered pairs failing" in result.summary
    assert [p.status for p in result.pairs] == ["pass", "fail"]
    finding = next(f for f in result.findings if f.code == "below-expectation")
    assert finding.subject == "GPU1->GPU0" and "39.0 GB/s < 45 GB/s" in finding.message
    assert finding.cause and "host bridge (NODE)" in finding.cause


def test_numa_node_from_memory_affinity_when_nvml_has_no_id() -> None:
    # The recorded VM: GPU NUMA ID not supported, NUMA affinity 0 (as nvidia-smi topo shows).
    topology = node(numas=(None, None), level=SYS)
    assert [gpu.numa_affinity for gpu in topology.gpus] == [[0], [0]]
    assert verdict.classify(topology.pairs[0], *topology.gpus) == "same_numa"
    for gpu in topology.gpus:
        gpu.numa_affinity = []
    assert verdict.classify(topology.pairs[0], *topology.gpus) == "cross_numa"  # falls back to the SYS level


def test_nvlink_pair_is_held_to_the_nvlink_expectation() -> None:
    topology = node(nvlinks=18)
    result = verdict.judge(topology, measured((SAME_NUMA_UNI, SAME_NUMA_UNI), SAME_NUMA_BIDIR), Expectations())
    assert {(p.link_class, p.legend, p.expected_gbps) for p in result.pairs} == {("nvlink", "NV18", 100.0)}
    assert result.exit_code == verdict.EXIT_FAIL


def test_vm_pass_through_with_two_gpus_fails_and_says_why() -> None:
    topology = node(status=CHIPSET_NOT_SUPPORTED, virtualization=1)
    # Even at a passing speed: copies staged through host memory are not P2P.
    result = verdict.judge(topology, measured((SAME_NUMA_UNI, SAME_NUMA_UNI), SAME_NUMA_BIDIR, peer_access=False),
                           Expectations())
    assert result.exit_code == verdict.EXIT_FAIL
    vm = [f for f in result.findings if f.code == "vm-passthrough"]
    assert len(vm) == 2 and all(f.severity == "fail" and "P2P between GPUs is lost" in f.message for f in vm)
    unavailable = next(f for f in result.findings if f.code == "p2p-unavailable")
    assert "CHIPSET_NOT_SUPPORTED" in unavailable.message
    assert unavailable.cause and "flattened virtual PCIe tree" in unavailable.cause
    assert unavailable.fix and "LXC container" in unavailable.fix
    assert {p.path for p in result.pairs} == {"staged"}


def test_cuda_refusing_peer_access_is_p2p_unavailable_even_if_nvml_says_ok() -> None:
    result = verdict.judge(node(), measured((SAME_NUMA_UNI, SAME_NUMA_UNI), SAME_NUMA_BIDIR, peer_access=False),
                           Expectations())
    finding = next(f for f in result.findings if f.code == "p2p-unavailable")
    assert "CUDA refuses peer access" in finding.message and result.exit_code == verdict.EXIT_FAIL


def test_not_required_turns_p2p_failures_into_warnings() -> None:
    topology = node(status=CHIPSET_NOT_SUPPORTED)
    result = verdict.judge(topology, measured((CROSS_NUMA_UNI, CROSS_NUMA_UNI), CROSS_NUMA_BIDIR, peer_access=False),
                           Expectations(required=False))
    assert result.exit_code == verdict.EXIT_PASS
    assert set(codes(result, "warn")) >= {"p2p-unavailable", "below-expectation"}
    assert {p.status for p in result.pairs} == {"warn"}
    chipset = next(f for f in result.findings if f.code == "p2p-unavailable")
    assert chipset.fix and "iommu=pt" in chipset.fix


def test_wrong_data_fails_even_when_p2p_is_not_required() -> None:
    result = verdict.judge(node(), measured((SAME_NUMA_UNI, SAME_NUMA_UNI), SAME_NUMA_BIDIR, verified=False),
                           Expectations(required=False))
    assert result.exit_code == verdict.EXIT_FAIL
    mismatch = next(f for f in result.findings if f.code == "data-mismatch")
    assert mismatch.severity == "fail" and mismatch.cause and "IOMMU" in mismatch.cause


def test_downtrained_link_under_load_fails_and_is_named_as_a_cause() -> None:
    topology = node()
    load = topology.gpus[1].under_load
    assert load is not None and (load.pcie_gen, load.pcie_width) == (5, 16)  # as recorded
    load.pcie_gen, load.pcie_width = 4, 8  # derived: what a link trained down by a bad riser reads
    result = verdict.judge(topology, measured((SAME_NUMA_UNI, CROSS_NUMA_UNI), SAME_NUMA_BIDIR), Expectations())
    link = next(f for f in result.findings if f.code == "downtrained-link")
    assert link.subject == "GPU1" and "Gen4 x8 under load, capable of Gen5 x16" in link.message
    below = next(f for f in result.findings if f.code == "below-expectation")
    assert below.cause and "GPU1 link downtrained" in below.cause


def test_single_gpu_is_not_a_pass_by_vacuum() -> None:
    assert RECORDED.topology is not None
    result = verdict.judge(RECORDED.topology, RECORDED.measurements, Expectations())
    assert result.exit_code == verdict.EXIT_PAIRS_NOT_APPLICABLE != verdict.EXIT_PASS
    wants_eight = verdict.judge(RECORDED.topology, RECORDED.measurements, Expectations(min_gpus=8))
    assert wants_eight.exit_code == verdict.EXIT_FAIL and "too-few-gpus" in codes(wants_eight, "fail")


def test_a_hung_copy_fails_the_node() -> None:
    assert RECORDED.topology is not None and RECORDED.measurements is not None
    hung = dataclasses.replace(RECORDED.measurements, hung_step="cuda:0->cuda:1 unidirectional")
    result = verdict.judge(RECORDED.topology, hung, Expectations())
    assert result.exit_code == verdict.EXIT_FAIL and "copy-hung" in codes(result, "fail")


def test_cuinit_error_3_is_the_hmm_case_with_the_host_fix() -> None:
    assert RECORDED.topology is not None and RECORDED.topology.host.uvm_disable_hmm == "N"  # as recorded
    findings = verdict.driver_probe_findings(DriverProbe("libcuda.so.1", 3, "CUDA_ERROR_NOT_INITIALIZED"),
                                             RECORDED.topology.host)
    (hmm,) = findings
    assert hmm.code == "cuda-hmm" and hmm.category == "environment"
    assert hmm.fix and "options nvidia_uvm uvm_disable_hmm=1" in hmm.fix and "HOST" in hmm.fix
    assert hmm.cause and "uvm_disable_hmm is N" in hmm.cause
    assert verdict.exit_code_for(findings, pairs_applicable=True) == verdict.EXIT_ENVIRONMENT


@pytest.mark.parametrize(("probe", "code"), [
    (DriverProbe("libcuda.so.1", 0, "CUDA_SUCCESS"), None),
    (DriverProbe("libcuda.so.1", 100, "CUDA_ERROR_NO_DEVICE"), "no-gpu"),
    (DriverProbe(None, None, "libcuda.so.1 not found"), "no-cuda-driver"),
    (DriverProbe("libcuda.so.1", 999, "CUDA_ERROR_UNKNOWN"), "cuda-init"),
])
def test_driver_probe_findings(probe: DriverProbe, code: str | None) -> None:
    assert RECORDED.topology is not None
    found = verdict.driver_probe_findings(probe, RECORDED.topology.host)
    assert [f.code for f in found] == ([code] if code else [])


def test_missing_nvidia_uvm_is_named() -> None:
    assert RECORDED.topology is not None
    host = dataclasses.replace(RECORDED.topology.host, dev_nvidia_uvm=False)
    (finding,) = verdict.driver_probe_findings(DriverProbe("libcuda.so.1", 999, "CUDA_ERROR_UNKNOWN"), host)
    assert finding.code == "no-nvidia-uvm" and finding.fix and "nvidia-modprobe -u -c=0" in finding.fix


def test_expectations_from_a_plain_mapping() -> None:
    assert Expectations.from_mapping({"same_numa_gbps": 50, "required": False}) == Expectations(
        same_numa_gbps=50, required=False)
    for bad in ({"same_numa_gbs": 50}, {"cross_numa_gbps": 0}, {"nvlink_gbps": True}, {"required": "yes"},
                {"min_gpus": 0}):
        with pytest.raises(ValueError):
            Expectations.from_mapping(bad)


def test_defaults_match_the_host_file_p2p_section() -> None:
    from gpunode.hostfile import P2pExpect

    host_defaults = P2pExpect()
    assert Expectations() == Expectations(**host_defaults.model_dump())


def test_exit_codes_are_documented() -> None:
    assert sorted(verdict.EXIT_CODES) == [0, 1, 2, 4, 5]
    assert verdict.__doc__ and all(f"- {code} " in verdict.__doc__ for code in verdict.EXIT_CODES)
