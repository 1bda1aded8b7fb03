"""Break the lab node, see `gpunode check` name the breakage, re-provision, see check pass.

Each scenario breaks one thing the way an operator or an accident would, on the real lab
(fakepve for the API, the LXC containers for the host and the node).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import gpunode_lab as lab
from gpunode.stages.p2p import stage as p2p_stage
from gpunode_lab import kernels as labkernels
from gpunode_lab.image import fake_tag
from gpunode.stages.container.client import Connection, PveClient
from gpunode.derive.serverspec import CONTAINER_NAME

ROOT = Path(__file__).resolve().parents[2]
LAB_HOSTS = ROOT / "inventory" / "lab" / "host.yml"


def api() -> PveClient:
    return PveClient(Connection(url=lab.PVE_URL, node=lab.PVE_NODE, password=lab.PVE_PASSWORD_FILE.read_text().strip(),
                                ca_file=str(lab.PVE_CA)))


def on(ip: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lab.ssh_command(command, host=ip), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def stop_container() -> None:
    api().call("POST", "nodes/pve1/lxc/200/status/stop")


def remove_devn() -> None:
    api().call("PUT", "nodes/pve1/lxc/200/config", delete="dev1")


def mount_key(target: str) -> str:
    """The mpN that mounts ``target`` in container 200 (the driver tree's and the weights' are placed by target)."""
    config = api().get("nodes/pve1/lxc/200/config")
    keys = [key for key, value in config.items() if key.startswith("mp") and f",mp={target}," in f"{value},"]
    assert len(keys) == 1, (target, config)
    return keys[0]


def remove_driver_mount() -> None:
    # Removed from the config and the container restarted, as a hand edit in the GUI would end.
    api().call("PUT", "nodes/pve1/lxc/200/config", delete=mount_key("/usr/local/nvidia"))
    api().call("POST", "nodes/pve1/lxc/200/status/stop")
    api().call("POST", "nodes/pve1/lxc/200/status/start")


def remove_hmm_option() -> None:
    on(lab.HOST_CONTAINER_IP, "rm -f /etc/modprobe.d/gpunode-nvidia-uvm.conf")


def stop_docker() -> None:
    on(lab.CONTAINER_IP, "systemctl stop docker docker.socket")


def remove_probe_image() -> None:
    on(lab.CONTAINER_IP, "docker rmi -f gpunode/probe:bookworm-1")


def edit_node_record() -> None:
    on(lab.CONTAINER_IP, "sed -i 's/gpunode\\/sglang:[^\"]*/gpunode\\/sglang:edited-by-hand/' /etc/gpunode/node.json")


def disable_node_unit() -> None:
    on(lab.HOST_CONTAINER_IP, "systemctl disable gpunode-nvidia-nodes.service")


def hand_gpus_back_to_vfio() -> None:
    on(lab.HOST_CONTAINER_IP, "echo 'options vfio-pci ids=10de:2bb1' > /etc/modprobe.d/vfio.conf")


def remove_server_image() -> None:
    # -f: the running server holds it; the tag goes, the server keeps running on the untagged image.
    on(lab.CONTAINER_IP, f"docker rmi -f {fake_tag()}")


def kill_server_container() -> None:
    on(lab.CONTAINER_IP, f"docker kill {CONTAINER_NAME}")


def rewrite_node_json(path: str, **changes: object) -> None:
    program = (f"import json; p = {path!r}; d = json.load(open(p)); d.update({changes!r}); "
               "open(p, 'w').write(json.dumps(d))")
    result = on(lab.CONTAINER_IP, f"python3 -c {shlex.quote(program)}")
    assert result.returncode == 0, result.stderr


def record_failed_verify() -> None:
    rewrite_node_json("/etc/gpunode/image.json", verified=False, failed=["sm120-kernels"])


Scenario = tuple[str, Callable[[], None], str, str]  # name, breakage, layer, the check that must name it
SCENARIOS: list[Scenario] = [
    ("container-stopped", stop_container, "container", "test_container_running"),
    ("devn-removed", remove_devn, "container", "test_container_config_matches[devices]"),
    ("driver-mount-removed", remove_driver_mount, "container", "test_container_config_matches[driver mount]"),
    ("hmm-option-removed", remove_hmm_option, "host", "test_hmm_option_configured"),
    ("docker-stopped", stop_docker, "node", "test_docker_running"),
    ("probe-image-removed", remove_probe_image, "node", "test_gpu_handoff_to_docker"),
    ("node-record-edited", edit_node_record, "node", "test_node_record_matches"),
    ("node-unit-disabled", disable_node_unit, "host", "test_device_node_unit_enabled"),
    ("gpus-back-on-vfio", hand_gpus_back_to_vfio, "host", "test_no_nvidia_ids_left_for_vfio"),
    ("image-removed", remove_server_image, "image", "test_server_image_present"),
    ("server-container-killed", kill_server_container, "serve", "test_server_container_running"),
    ("image-record-says-verify-failed", record_failed_verify, "image", "test_image_verified"),
]
# One provision repairs each group: breakages whose repairs are separate tasks of separate stages
# (or separate files of the host stage), so that none is repaired as a side effect of another's.
# A breakage that touches what others stand on (the container's state or mounts, Docker, the image
# the server runs, the probe image, whose rebuild re-runs the hand-off probe) stays alone.
GROUPS: list[tuple[str, ...]] = [
    ("hmm-option-removed", "node-unit-disabled", "gpus-back-on-vfio"),
    ("node-record-edited", "server-container-killed"),
    ("devn-removed", "image-record-says-verify-failed"),
    ("container-stopped",), ("driver-mount-removed",), ("docker-stopped",), ("probe-image-removed",),
    ("image-removed",),
]
BY_NAME = {scenario[0]: scenario for scenario in SCENARIOS}


def test_every_scenario_is_in_one_group() -> None:
    grouped = [name for group in GROUPS for name in group]
    assert sorted(grouped) == sorted(BY_NAME) and len(set(grouped)) == len(grouped)


def check(gpunode, *layers: str, hosts: Path = LAB_HOSTS) -> tuple[int, dict]:
    chosen = [arg for layer in layers for arg in ("--layer", layer)]
    result = gpunode("check", str(hosts), "--json", *chosen, timeout=600)
    return result.returncode, json.loads(result.stdout)


def failing(report: dict) -> set[tuple[str, str]]:
    return {(r["layer"], r["check"]) for r in report["results"] if r["status"] == "fail"}


@pytest.fixture(scope="module")
def converged(gpunode_module) -> None:
    result = gpunode_module("provision", str(LAB_HOSTS), timeout=900)
    assert result.returncode == 0, result.stderr


# Whether the last full `gpunode check` of this module passed with nothing run on the lab since: the
# next group's healthy baseline is then that check, not another one.
_HEALTHY = {"checked": False}


@pytest.fixture
def repaired_after(gpunode, request: pytest.FixtureRequest) -> Iterator[None]:
    """Leave the lab converged for the next scenario. A passing one ends converged (its last check
    passed), so only a failed one needs the extra provision."""
    yield
    call = getattr(request.node, "report_call", None)
    if call is None or not call.passed:
        gpunode("provision", str(LAB_HOSTS), timeout=900)


@pytest.mark.parametrize("group", GROUPS, ids=["+".join(group) for group in GROUPS])
def test_check_names_it_and_provision_repairs_it(gpunode, converged: None, repaired_after: None,
                                                 group: tuple[str, ...]) -> None:
    # The scenarios' layers before and after the breakages (each layer alone is a third of a full
    # check); the whole node after the one repair.
    scenarios = [BY_NAME[name] for name in group]
    layers = sorted({layer for _name, _breakage, layer, _check in scenarios})
    if not _HEALTHY["checked"]:  # else the previous group's last check, of every layer, is the baseline
        rc, healthy = check(gpunode, *layers)
        assert rc == 0, failing(healthy)
    _HEALTHY["checked"] = False
    for _name, breakage, _layer, _check in scenarios:
        breakage()
    rc, broken = check(gpunode, *layers)
    assert rc == 1
    for name, _breakage, layer, check_name in scenarios:
        assert (layer, check_name) in failing(broken), (name, failing(broken))
        message = next(r["message"] for r in broken["results"] if (r["layer"], r["check"]) == (layer, check_name))
        assert "gpunode provision" in message, f"{name}: the failure names the remedy"
        if check_name == "test_server_container_running":
            assert "last log lines:" in message and "The server is fired up" in message, message
        if check_name == "test_docker_running":
            assert "last journal lines:" in message and "Stopped docker.service" in message, message
    repaired = gpunode("provision", str(LAB_HOSTS), "--json", timeout=900)
    assert repaired.returncode == 0, repaired.stderr
    assert sum(json.loads(repaired.stdout)["stats"].get("changed", {}).values()) >= len(scenarios)
    rc, after = check(gpunode)
    assert rc == 0, failing(after)
    _HEALTHY["checked"] = True


def test_healthy_node_reprovisioned_changes_nothing(gpunode, converged: None) -> None:
    result = gpunode("provision", str(LAB_HOSTS), "--json", timeout=900)
    assert result.returncode == 0
    assert not json.loads(result.stdout)["stats"].get("changed"), "a healthy node was changed"


def test_interrupted_provision_then_rerun_converges(gpunode, converged: None, tmp_path: Path) -> None:
    stop_docker()
    on(lab.CONTAINER_IP, "rm -f /etc/gpunode/node.json")
    env = {**os.environ, "GPUNODE_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen([str(Path(os.sys.executable).parent / "gpunode"), "provision", str(LAB_HOSTS)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    # Kill it mid-run: once the node stage has started.
    deadline = time.monotonic() + 300
    seen = ""
    while time.monotonic() < deadline and "== node:" not in seen:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
    assert "== node:" in seen, seen[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    rerun = gpunode("provision", str(LAB_HOSTS), "--json", timeout=900)
    assert rerun.returncode == 0, rerun.stderr
    rc, report = check(gpunode)
    assert rc == 0, failing(report)


def test_p2p_verdict_is_read_from_the_node_record(gpunode, converged: None) -> None:
    """The lab never measures P2P (no GPU): its check skips, saying so. A record as the p2p stage
    writes it (from the two-GPU H200 recording) is judged: passing, stale, failing."""
    path = "/etc/gpunode/p2p.json"
    fixture = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "p2p" / "h200x2" / "p2p_x2.json").read_text())
    verdict = fixture["verdict"]

    def write(record: dict) -> tuple[int, dict]:
        program = f"import json; open({path!r}, 'w').write(json.dumps({record!r}))"
        assert on(lab.CONTAINER_IP, f"python3 -c {shlex.quote(program)}").returncode == 0
        return check(gpunode, "p2p")

    try:
        rc, report = check(gpunode, "p2p")
        [result] = report["results"]
        assert rc == 0 and result["status"] == "skip" and "never measured here" in result["message"]
        rc, report = write(p2p_stage.record([0, 1], 0, verdict))
        assert rc == 0 and report["results"][0]["status"] == "pass"
        rc, report = write(p2p_stage.record([0], 0, verdict))
        assert rc == 1 and "measured with GPUs [0], the host file selects [0, 1]" in report["results"][0]["message"]
        failing = {**verdict, "findings": verdict["findings"] + [
            {"severity": "fail", "code": "p2p-unavailable", "subject": "GPU0->GPU1", "message": "P2P read not supported"}]}
        rc, report = write(p2p_stage.record([0, 1], 1, failing))
        message = report["results"][0]["message"]
        assert rc == 1 and "GPU0->GPU1 p2p-unavailable: P2P read not supported" in message
        assert "gpunode provision --tags p2p" in message
        # A fabric cause the verdict named (issue #35) is carried with its fix.
        acs = {"severity": "fail", "code": "acs", "subject": "node", "message": "ACS redirects peer traffic",
               "fix": "set prepare.clear_acs"}
        rc, report = write(p2p_stage.record([0, 1], 1, {**failing, "findings": failing["findings"] + [acs]}))
        message = report["results"][0]["message"]
        assert rc == 1 and "causes: FAIL node acs: ACS redirects peer traffic -> set prepare.clear_acs" in message
    finally:
        on(lab.CONTAINER_IP, f"rm -f {path}")


NEW_DRIVER = "580.172.08"  # the recorded 580.159.04's files renamed (labdriver keeps the length)
FACTS = lab.HOST_ROOTFS / lab.LAB_HOST_FACTS_ROOT.lstrip("/")
VERSION_FILES = ("sys/module/nvidia/version", "proc/driver/nvidia/version")


def upgrade_host_driver(old: str, new: str) -> None:
    """What a driver upgrade leaves on the host: the new version loaded, its files, the ld cache."""
    from gpunode_lab import driver as labdriver

    labdriver.lay_out(lab.HOST_DRIVER_LAYOUT, FACTS, new)
    for rel in VERSION_FILES:
        path = FACTS / rel
        path.write_text(path.read_text().replace(old, new))
    if new == "580.159.04":  # back to the recording: the renamed files go
        for stale in (FACTS / "usr" / "lib" / "x86_64-linux-gnu").glob(f"*{old}"):
            stale.unlink()


def test_host_driver_upgrade_is_named_and_repaired(gpunode, converged: None, tmp_path: Path) -> None:
    hosts = tmp_path / "host.yml"
    hosts.write_text(LAB_HOSTS.read_text().replace('version: "580.159.04"', f'version: "{NEW_DRIVER}"'))
    rc, healthy = check(gpunode, "host", "container", "node")
    assert rc == 0, failing(healthy)
    driver_key = mount_key("/usr/local/nvidia")
    upgrade_host_driver("580.159.04", NEW_DRIVER)
    try:
        rc, broken = check(gpunode, "host", "container", "node", hosts=hosts)
        assert rc == 1
        assert {("host", "test_driver_tree_built_for_the_loaded_driver"),
                ("container", "test_container_config_matches[driver mount]"),
                ("node", "test_driver_tree_is_the_host_modules")} <= failing(broken), failing(broken)
        # Without a restart the new mount point waits, and the node stage names the stale mount.
        stale = gpunode("provision", str(hosts), "--tags", "host,container,node", "--json", timeout=900)
        assert stale.returncode == 1
        failure = json.loads(stale.stdout)["failures"][0]
        assert "mounts NVIDIA user space 580.159.04, but the host's module is 580.172.08" in failure["message"]
        assert f"must restart to apply {driver_key}" in stale.stderr
        trees = on(lab.HOST_CONTAINER_IP, "ls /var/lib/gpunode/nvidia").stdout.split()
        assert trees == ["580.159.04", NEW_DRIVER], "the old tree stays while the container still mounts it"
        repaired = gpunode("provision", str(hosts), "--tags", "host,container,node", "--restart-container", timeout=900)
        assert repaired.returncode == 0, repaired.stderr
        rc, after = check(gpunode, "host", "container", "node", hosts=hosts)
        assert rc == 0, failing(after)
        assert on(lab.HOST_CONTAINER_IP, "ls /var/lib/gpunode/nvidia").stdout.split() == [NEW_DRIVER]
        assert f"Driver Version: {NEW_DRIVER}" in on(lab.CONTAINER_IP, "/usr/local/nvidia/bin/nvidia-smi").stdout
    finally:
        upgrade_host_driver(NEW_DRIVER, "580.159.04")
        back = gpunode("provision", str(LAB_HOSTS), "--tags", "host,container,node", "--restart-container", timeout=900)
        assert back.returncode == 0, back.stderr
    rc, restored = check(gpunode)
    assert rc == 0, failing(restored)



def newest_kernel() -> str:
    """The kernel the recovery tests install: newer than the lab host's (labkernels)."""
    return labkernels.kernels()[2]

STANDIN_SOURCE = f"/usr/src/{labkernels.MODULE}-{labkernels.VERSION}/nvidia.c"


def test_new_kernel_without_the_module_is_named_and_repaired(gpunode, converged: None) -> None:
    """An `apt full-upgrade` brought a newer kernel and nothing built the NVIDIA module for it."""
    rc, healthy = check(gpunode, "host")
    assert rc == 0, failing(healthy)
    new_kernel = newest_kernel()
    assert on(lab.HOST_CONTAINER_IP, labkernels.install_kernel(new_kernel)).returncode == 0
    try:
        rc, broken = check(gpunode, "host")
        assert rc == 1
        assert {("host", f"test_module_built_for_kernel[{new_kernel}]"),
                ("host", "test_host_finding[kernel_headers]")} <= failing(broken), failing(broken)
        message = next(r["message"] for r in broken["results"] if r["check"].endswith(f"[{new_kernel}]"))
        assert "GPUs will be gone after the next reboot" in message and "gpunode provision --tags host" in message
        repaired = gpunode("provision", str(LAB_HOSTS), "--tags", "host", timeout=900)
        assert repaired.returncode == 0, repaired.stderr
        assert f"safe to reboot: {new_kernel} boots next and has the NVIDIA module" in repaired.stderr
        # Debian's headers and dkms built the stand-in for real: the module file says what it is.
        built = on(lab.HOST_CONTAINER_IP, f"modinfo -F description /lib/modules/{new_kernel}/updates/dkms/nvidia.ko*")
        assert "gpunode lab stand-in" in built.stdout, built.stderr
        again = gpunode("provision", str(LAB_HOSTS), "--tags", "host", "--json", timeout=900)
        assert again.returncode == 0 and not json.loads(again.stdout)["stats"].get("changed"), again.stdout[-2000:]
        rc, after = check(gpunode, "host")
        assert rc == 0, failing(after)
    finally:
        on(lab.HOST_CONTAINER_IP, labkernels.remove_kernel(new_kernel))


def test_failed_dkms_build_for_the_next_kernel_stops_the_stage(gpunode, converged: None) -> None:
    """A kernel the driver cannot be built for (here: a source that does not compile for it)."""
    new_kernel = newest_kernel()
    # The headers first (Debian's dkms hook builds the module for them), then a source that no
    # longer compiles, rebuilt for that kernel: the build fails as for a kernel the driver is too old for.
    breakage = (labkernels.install_kernel(new_kernel) + " && export DEBIAN_FRONTEND=noninteractive && "
                f"apt-get install -y -q linux-headers-{new_kernel} >/dev/null && "
                f"dkms remove -m {labkernels.MODULE} -v {labkernels.VERSION} -k {new_kernel} >/dev/null && "
                f"cp {STANDIN_SOURCE} {STANDIN_SOURCE}.orig && "
                f"echo 'this_kernel_is_too_new(); /* gpunode lab */' >> {STANDIN_SOURCE} && "
                f"{{ dkms build -m {labkernels.MODULE} -v {labkernels.VERSION} -k {new_kernel} >/dev/null 2>&1; true; }}")
    try:
        done = on(lab.HOST_CONTAINER_IP, breakage)
        assert done.returncode == 0, done.stderr
        rc, broken = check(gpunode, "host")
        assert rc == 1
        assert {("host", "test_host_finding[dkms_build]"), ("host", "test_host_finding[kernel_support]"),
                ("host", f"test_module_built_for_kernel[{new_kernel}]")} <= failing(broken), failing(broken)
        result = gpunode("provision", str(LAB_HOSTS), "--tags", "host", "--json", timeout=900)
        assert result.returncode == 1
        failure = json.loads(result.stdout)["failures"][0]
        assert failure["task"] == "Evaluate the host (named findings, each with its fix)"
        assert "dkms_build" in failure["message"] and "this_kernel_is_too_new" in failure["message"]
        assert "prepare.pin_kernel" in failure["message"]
        assert not json.loads(result.stdout)["stats"].get("changed"), "a blocking finding changes nothing"
    finally:
        # The failed build's log goes too: DKMS keeps it until the next build, and it names this kernel.
        on(lab.HOST_CONTAINER_IP, f"test -e {STANDIN_SOURCE}.orig && mv {STANDIN_SOURCE}.orig {STANDIN_SOURCE}; "
           f"rm -rf /var/lib/dkms/{labkernels.MODULE}/{labkernels.VERSION}/build; "
           + labkernels.remove_kernel(new_kernel))
