"""The provision stages, in order. One name per stage: the play (playbooks/stages/<name>.yml, tagged
<name>), the role (gpunode.core.<name>), the package (gpunode.<name>), the check layer
(checks/test_<name>.py) and the CLI verb all carry it (ARCHITECTURE.md; tests/unit/test_stages.py)."""

from __future__ import annotations

from dataclasses import dataclass



@dataclass(frozen=True)
class Stage:
    name: str
    summary: str
    checks: tuple[str, ...]


STAGES: tuple[Stage, ...] = (
    Stage("host", "prepare the Proxmox host: open driver, HMM off, GPUs off vfio-pci, device nodes", (
        "NVIDIA driver at the pinned version, open kernel module",
        "nvidia_uvm uvm_disable_hmm = Y",
        "no GPU bound to vfio-pci",
        "nvidia-persistenced running",
        "/dev/nvidia* and /dev/nvidia-uvm present",
    )),
    Stage("container", "create or converge the LXC container with the GPUs passed through (Proxmox API)", (
        "container config equals the host file (every devN line)",
        "container running",
    )),
    Stage("node", "set up the inside of the container", (
        "reachable over SSH, Debian 12 with systemd",
        "every selected /dev/nvidiaN, nvidiactl and nvidia-uvm present as char devices with the right major:minor",
        "device nodes open without EPERM (the cgroup hand-off works)",
    )),
    Stage("model", "the pinned revision of the weights in the Proxmox host's store (fetched from the Hub) or where "
                   "the host file says, proven whole", (
        "every file of the pinned revision present with its size (sha256 against the manifest: verify full)",
        "every shard's safetensors header reads; the index's shards and tensors are all there",
        "config.json names the profile's architecture and quantization",
        "the node's record says the model the server mounts was verified",
    )),
    Stage("image", "build the pinned CUDA + SGLang + FlashInfer image on the node", (
        "image present with the content tag",
        "pins, patches and sm_120 kernels verified inside the image",
    )),
    Stage("p2p", "GPU topology and peer-to-peer bandwidth, with the Proxmox host's PCIe fabric read (read-only) "
                 "for the verdict's causes", (
        "P2P OK for every pair, bandwidth at or above the host file's expectations",
        "a failure carries the fabric causes the verdict named (acs, bar1, p2p_mode, write_collapse) with their fixes",
    )),
    Stage("serve", "start the SGLang server container", (
        "server container running with the profile's command line",
        "/health_generate returns 200",
    )),
    Stage("smoke", "prove the server answers correctly", (
        "/v1/models lists the served name; known answer; reasoning on/off; tool call; short bench with 0 failures",
    )),
    Stage("router", "SGLang's router in front of every host's server (host files with a router: section)", (
        "router container running the pinned, hash-locked router image with the host file's workers and policy",
        "every host's server registered and healthy in the router; /v1/models answers through it",
        "the smoke checks pass through the router",
    )),
    Stage("monitor", "Prometheus, Alertmanager, node-exporter and the GPU exporter on the node, alerts that name the "
                     "fix (host files with a monitor: section)", (
        "Prometheus, Alertmanager and node-exporter running, on the node's loopback",
        "every scrape target up in Prometheus (server, GPU exporter, node-exporter, the router where it runs)",
        "gpunode's alert rules loaded; Alertmanager ready and known to Prometheus",
    )),
)

STAGE_NAMES: tuple[str, ...] = tuple(stage.name for stage in STAGES)
# What a lab run leaves out unless named with --tags (then it runs, and says what is missing).
LAB_LEAVES_OUT: dict[str, str] = {
    "image": "its verify fails on this machine: no CUDA 12.8 nvcc is installable from PyPI or Debian, and "
             "flashinfer-cubin 0.6.3 has no sm_120 kernels (README, 'The image'); `gpunode image build` and the "
             "image tests exercise it",
    "p2p": "the lab has no GPU behind its node",
    "serve": "the lab has no GPU behind its node",
    "smoke": "the lab has no GPU behind its node",
    "router": "the lab has no GPU behind its nodes: no server for the router to route to",
    "monitor": "the lab has no GPU behind its node: no server or GPU to watch",
}
# With image.lab_stand_in the image stage ships the fake server's image and serve/smoke run it.
STAND_IN_RUNS: tuple[str, ...] = ("image", "serve", "smoke", "router", "monitor")


def lab_leaves_out(stand_in: bool) -> dict[str, str]:
    """The stages a lab run leaves out, with why; fewer when the lab has a stand-in server."""
    return {name: why for name, why in LAB_LEAVES_OUT.items() if not (stand_in and name in STAND_IN_RUNS)}


def select(tags: list[str] | None, start: str | None) -> list[str]:
    """Stage names to run for ``--tags`` and ``--from``; raises ValueError naming a bad one."""
    for name in (tags or []) + ([start] if start else []):
        if name not in STAGE_NAMES:
            raise ValueError(f"unknown stage {name!r} (stages: {', '.join(STAGE_NAMES)})")
    chosen = list(STAGE_NAMES)
    if start:
        chosen = chosen[chosen.index(start):]
    if tags:
        chosen = [name for name in chosen if name in tags]
    if not chosen:
        raise ValueError("--tags and --from select no stage together")
    return chosen
