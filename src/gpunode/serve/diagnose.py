"""Why a server failed to start: known signatures in SGLang's log, each with the fix.

The signatures are the messages the failures really print (sglang 0.5.9, torch, NCCL, transformers,
Docker) and the ones this project has met (FIELD-NOTES s2, s5). The first signature that matches
wins, so the more specific ones come first. Every line shown to a person goes through ``redact``:
sglang 0.5.9 logs its ``server_args`` at start, API key included.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Signature:
    key: str
    title: str
    patterns: tuple[str, ...]
    fix: str


@dataclass(frozen=True)
class Diagnosis:
    key: str
    title: str
    fix: str
    evidence: str  # the log line that matched (redacted), or the last error-looking line
    exit_code: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {"key": self.key, "title": self.title, "fix": self.fix, "evidence": self.evidence,
                "exit_code": self.exit_code}


SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "model_missing", "the model directory is missing or holds no checkpoint",
        (r"bind source path does not exist", r"Can't load the configuration of",
         r"does not appear to have a file named config\.json", r"Repo id must be in the form",
         r"HFValidationError", r"LocalEntryNotFoundError", r"We couldn't connect to 'https://huggingface\.co'"),
        "put the checkpoint (config.json, tokenizer, *.safetensors) at the host file's model.path on the node; "
        "the server runs with HF_HUB_OFFLINE=1 and never downloads",
    ),
    Signature(
        "page_table_1_flattened", "NSA attention bug under prefix reuse (page_table_1_flattened AttributeError)",
        (r"AttributeError.*page_table_1_flattened", r"page_table_1_flattened.*AttributeError",
         r"has no attribute 'page_table_1_flattened'"),
        "keep --disable-radix-cache (the profile sets it; check server.flags does not set it to false)",
    ),
    Signature(
        "nan_in_sampling", "NaN/inf in the sampling probabilities",
        (r"probability tensor contains either `inf`, `nan` or element < 0",),
        "keep --nsa-decode-backend trtllm and --nsa-prefill-backend trtllm, --kv-cache-dtype bf16 and "
        "--fp4-gemm-backend flashinfer_cudnn (flashinfer#2708); check server.flags does not override them",
    ),
    Signature(
        "cuda_init_hmm", "cuInit failed with error 3 (CUDA_ERROR_NOT_INITIALIZED): the HMM problem",
        (r"CUDA_ERROR_NOT_INITIALIZED", r"Error 3: initialization error", r"cuInit\D{0,40}\b3\b",
         r"CUDA driver initialization failed"),
        "on the Proxmox host: `options nvidia_uvm uvm_disable_hmm=1` in /etc/modprobe.d/, then reload nvidia_uvm "
        "(or reboot); /sys/module/nvidia_uvm/parameters/uvm_disable_hmm must read Y (host file: "
        "prepare.disable_hmm, prepare.allow_module_reload)",
    ),
    Signature(
        "kv_cache_no_room", "no GPU memory left for the KV cache",
        (r"Not enough memory\. Please try to increase --mem-fraction-static",),
        "raise --mem-fraction-static (server.flags) or give the model more GPUs; check nothing else holds GPU memory",
    ),
    Signature(
        "cuda_oom", "CUDA out of memory",
        (r"CUDA out of memory", r"torch\.OutOfMemoryError", r"CUDA error: out of memory", r"cudaErrorMemoryAllocation"),
        "lower --mem-fraction-static (0.92 -> 0.88) or --max-running-requests in server.flags; check with "
        "nvidia-smi that no other process holds GPU memory (a previous server still running?)",
    ),
    Signature(
        "nccl_p2p", "NCCL / GPU peer-to-peer failure",
        (r"peer access is not supported", r"cudaErrorPeerAccess", r"ncclUnhandledCudaError", r"ncclSystemError",
         r"ncclInternalError", r"ncclInvalidUsage", r"NCCL error", r"NCCL WARN .*P2P"),
        "run `gpunode p2p` on the node: IOMMU in translated mode or PCIe ACS breaks P2P (iommu=pt, ACS off); "
        "to confirm, set server.env NCCL_P2P_DISABLE: '1' (slower) and NCCL_DEBUG: INFO",
    ),
    Signature(
        "nccl_hang", "an NCCL collective hung (watchdog timeout)",
        (r"Watchdog caught collective operation timeout", r"NCCL.{0,80}timed out", r"ProcessGroupNCCL.{0,80}[Tt]imeout"),
        "run `gpunode p2p` on the node (a P2P path that drops data hangs all-reduce); try server.env "
        "NCCL_P2P_DISABLE: '1' to confirm, NCCL_DEBUG: INFO for detail",
    ),
)

_ERRORISH = re.compile(r"(Error|Exception|error:|FAILED|Traceback)")
_SECRET_ASSIGNMENTS = re.compile(r"((?:admin_)?api_key=)('[^']*'|\"[^\"]*\")")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Hide secret values and any ``api_key='...'`` repr (sglang logs ServerArgs with the key in it)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return _SECRET_ASSIGNMENTS.sub(r"\1'***'", text)


def match_signature(text: str) -> tuple[Signature, str] | None:
    """The first known signature found in ``text`` and the line it was found on."""
    lines = text.splitlines()
    for signature in SIGNATURES:
        for pattern in signature.patterns:
            regex = re.compile(pattern)
            for line in reversed(lines):
                if regex.search(line):
                    return signature, line.strip()
    return None


def last_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if _ERRORISH.search(line):
            return line
    return lines[-1] if lines else "(no log output)"


def diagnose(log_text: str, exit_code: int | None = None, oom_killed: bool = False,
             secrets: Iterable[str] = ()) -> Diagnosis:
    """Name the failure seen in a server's log, with its fix. Always returns something."""
    secrets = tuple(secrets)
    found = match_signature(log_text)
    if found:
        signature, line = found
        return Diagnosis(signature.key, signature.title, signature.fix, redact(line, secrets)[:500], exit_code)
    if oom_killed:
        return Diagnosis("host_oom", "the kernel's OOM killer stopped the server (host RAM, not GPU memory)",
                         "give the container more memory (container.memory_gb) or lower OMP_NUM_THREADS; "
                         "loading reads the ~410 GB checkpoint through host memory",
                         redact(last_error_line(log_text), secrets)[:500], exit_code)
    return Diagnosis("unknown", f"the server exited{f' with status {exit_code}' if exit_code is not None else ''}",
                     "read the full log (docker logs <container>); the line below is the last error it printed",
                     redact(last_error_line(log_text), secrets)[:500], exit_code)


def diagnose_docker_error(message: str, model_path: str = "", image: str = "") -> Diagnosis | None:
    """Docker refusing to create or start the container, in words, with the fix."""
    found = match_signature(message)
    if found:
        signature, line = found
        fix = signature.fix if not model_path else f"{signature.fix} (model.path: {model_path})"
        return Diagnosis(signature.key, signature.title, fix, line[:500])
    known = (
        (r"could not select device driver .* with capabilities: \[\[gpu\]\]",
         "nvidia_runtime_missing", "Docker has no NVIDIA runtime for --gpus",
         "install nvidia-container-toolkit on the node, or start with GPU device nodes instead"),
        (r"error gathering device information|no such file or directory.*?/dev/nvidia",
         "device_node_missing", "an NVIDIA device node is missing on the node",
         "run the container and node stages again: /dev/nvidia* must exist inside the LXC container"),
        (r"error setting rlimit type 8|setting rlimits.*operation not permitted",
         "memlock_not_permitted", "Docker may not raise the locked-memory limit (memlock) that NCCL needs",
         ("the node lacks CAP_SYS_RESOURCE: make the LXC container privileged (container.unprivileged: false) or "
          "raise its limit (lxc.prlimit.memlock: unlimited in /etc/pve/lxc/<vmid>.conf)")),
        (r"port is already allocated|address already in use",
         "port_in_use", "the server port is taken on the node",
         "stop what listens there or choose another server.port"),
        (r"No such image|pull access denied|not found: manifest unknown",
         "image_missing", f"the image {image} is not on the node" if image else "the image is not on the node",
         "run the image stage (gpunode provision host.yml --tags image); images are built on the node, never pulled"),
    )
    for pattern, key, title, fix in known:
        if re.search(pattern, message, re.IGNORECASE):
            return Diagnosis(key, title, fix, message.strip()[:500])
    return None
