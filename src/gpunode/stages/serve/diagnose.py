"""Why a server failed: named findings from SGLang's log, each with the line, the cause and the fix.

Every signature matches a message a real component prints: sglang 0.5.9, transformers 5.2.0, torch
2.9.1, NCCL 2.27.5, FlashInfer 0.6.3, uvicorn, Docker; the source of each is cited beside it, and
tests/unit/test_diagnose_signatures.py holds the exact text of each. Findings are ordered by where
the failure began (the first line that shows it); a symptom that another finding explains is left
out (no GPU visible after CUDA's initialisation failed). A log with errors that no signature names
gives one ``unknown`` finding with its last relevant lines; a healthy log gives none. Every line
shown to a person goes through ``gpunode.ground.redact``: sglang logs its ``server_args`` at start, API key
included.

Time is linear in the log and memory bounded, whatever the log holds (``logread`` says what is
read of a file and how lines are cut). One pass keeps only what a finding needs: the first line of
each signature, the last error lines and the last line. The text is searched a chunk at a time
(about 1 MiB of whole lines joined), each signature's patterns once per chunk until it is found; no
pattern can match across a line break, so a chunk's matches are its lines' matches. No pattern
backtracks more than linearly: ``X.*Y`` is written ``_then(X, Y)``, whose attempts stop at the next
``X``, so a line with thousands of X costs one pass, not one per X.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpunode.ground.finding import FAIL, Finding
from gpunode.ground.nvidia import MOUNT_POINT
from gpunode.ground.redact import redact as redact  # serve's readiness and its tests take it from here
from gpunode.stages.serve.logread import LINE_CHARS as CUT_CHARS
from gpunode.stages.serve.logread import cut_lines, text_chunks

FIX_FLAGS = "correct server.flags in the host file (the message names the flag and the value)"


@dataclass(frozen=True)
class Signature:
    key: str
    title: str
    patterns: tuple[str, ...]
    fix: str
    cause: str = ""
    implied_by: tuple[str, ...] = ()  # findings that explain this one: it is left out beside them


# A finding (one named failure: its code, what it is, why it happens, the fix, and the log line
# that showed it) in `gpunode diagnose --json`, under the keys it always had.
KEYS = {"code": "id", "message": "summary", "cause": "cause", "fix": "fix", "evidence": "line"}


def finding_as_dict(finding: Finding) -> dict[str, str]:
    return finding.as_dict(KEYS)


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


def _then(first: str, later: str) -> str:
    """``first``, then ``later`` further on the same line: what ``first.*?later`` matches, in linear
    time. An attempt stops at the next ``first``, where the next attempt takes over, so each
    character is passed once; the two differ only if ``first`` could overlap the start of ``later``."""
    return f"{first}(?:(?!{first}).)*?{later}"


_CUDA_INIT = ("cuda_init_hmm", "cuda_unknown_error", "cuda_driver_mismatch")
_HMM_FIX = ("on the Proxmox host: `options nvidia_uvm uvm_disable_hmm=1` in /etc/modprobe.d/, then reload nvidia_uvm "
            "(or reboot); /sys/module/nvidia_uvm/parameters/uvm_disable_hmm must read Y (host file: "
            "prepare.disable_hmm, prepare.allow_module_reload)")
_P2P_FIX = ("run `gpunode p2p` on the node: IOMMU in translated mode or PCIe ACS breaks P2P (iommu=pt, ACS off); "
            "to confirm, set server.env NCCL_P2P_DISABLE: '1' (slower) and NCCL_DEBUG: WARN")

SIGNATURES: tuple[Signature, ...] = (
    # Python argparse, called by sglang 0.5.9 server_args.py:5592 (prepare_server_args); exit 2.
    Signature("bad_argument", "sglang's parser refused the command line",
              (r"launch_server\.py: error: ",),
              FIX_FLAGS, "a misspelt or unknown flag, or a value the flag does not take"),
    # torch 2.9.1 c10/cuda/CUDAFunctions.cpp:58 (cudaErrorInitializationError), warned at :119.
    Signature("cuda_init_hmm", "CUDA could not initialise (cuInit error 3): the HMM problem",
              (r"CUDA driver initialization failed, you might not have a CUDA gpu",),
              _HMM_FIX, "cuInit returned CUDA_ERROR_NOT_INITIALIZED: nvidia_uvm with HMM on an open-module host"),
    # torch 2.9.1 c10/cuda/CUDAFunctions.cpp:63 (cuInit 999).
    Signature("cuda_unknown_error", "CUDA could not initialise (CUDA unknown error)",
              (r"CUDA unknown error - this may be due to an incorrectly set up environment",),
              "load nvidia_uvm on the host and hand /dev/nvidia-uvm and /dev/nvidia-uvm-tools through (container "
              "stage: devN); if they are there, reload nvidia_uvm",
              "cuInit returned 999: the nvidia-uvm device nodes are missing or denied, or nvidia_uvm is wedged"),
    # torch 2.9.1 c10/cuda/CUDAFunctions.cpp:94 (the only "Error N: <text>" form).
    Signature("cuda_driver_mismatch", "the container's CUDA driver library does not fit the host's kernel module",
              (r"Error 80[34]: (system has unsupported display driver / cuda driver combination"
               r"|forward compatibility was attempted on non supported HW)",),
              "use the host driver's own user space (container.gpu_handoff: host-driver); remove any cuda-compat "
              "libcuda from LD_LIBRARY_PATH", "libcuda.so.1 in the container is another version than the host module"),
    # sglang 0.5.9 utils/common.py:2059 (get_device); also follows every CUDA init failure.
    Signature("no_gpu_visible", "no GPU is visible in the server container",
              (r"No accelerator \(CUDA, XPU, HPU, NPU, MUSA\) is available",),
              "check the GPU hand-off: the /dev/nvidia* nodes and libcuda.so.1 in the container (the node's CDI spec, "
              "or the explicit --device list); `gpunode check` names what is missing",
              "no libcuda.so.1 or no /dev/nvidiaN in the container", implied_by=_CUDA_INIT),
    # sglang 0.5.9 utils/common.py:1757-1760 (get_nvgpu_memory_capacity).
    Signature("nvidia_smi_missing", "nvidia-smi is not in the server container",
              (r"nvidia-smi not found\. Ensure NVIDIA drivers are installed",),
              f"the driver tree's bin/ must be mounted at {MOUNT_POINT}/bin, on PATH (node stage; `gpunode check`)",
              "sglang 0.5.9 runs nvidia-smi while it reads its arguments"),
    # transformers 5.2.0 models/auto/configuration_auto.py:1445-1448.
    Signature("model_dir_empty", "the model directory has no config.json",
              (r"Unrecognized model in \S+\. Should have a `model_type` key in its config\.json",),
              "put the whole checkpoint (config.json, tokenizer files, *.safetensors and the index) at model.path "
              "on the node", "the directory exists but is empty or incomplete (a copy not finished?)"),
    # transformers 5.2.0 utils/hub.py:468 (huggingface_hub's HFValidationError, re-raised).
    Signature("model_path_missing", "the model path does not exist in the container",
              (r"Repo id must be in the form 'repo_name' or 'namespace/repo_name'",),
              "point model.path at the directory that holds config.json",
              "--model-path names a folder that is not there, so transformers took it for a hub id"),
    # transformers 5.2.0 utils/hub.py:493-497.
    Signature("model_not_cached_offline", "a hub id was given, and the server never downloads",
              (r"We couldn't connect to 'https://huggingface\.co' to load the files",),
              "give the local checkpoint directory as model.path (the server runs with HF_HUB_OFFLINE=1)",
              "the model is named by its hub id with offline mode on"),
    # moby volume/mounts/errors.go (errBindSourceDoesNotExist): Docker refuses the container.
    Signature("bind_source_missing", "the model directory does not exist on the node",
              (r"bind source path does not exist",),
              "create or copy the checkpoint at the host file's model.path on the node",
              "Docker cannot bind-mount a path that is not there"),
    # transformers 5.2.0 configuration_utils.py:665.
    Signature("config_not_json", "config.json is not valid JSON",
              (_then(r"It looks like the config file at '", r".' is not a valid JSON file"),),
              "copy config.json again from the checkpoint", "a truncated or empty config.json (a partial copy)"),
    # transformers 5.2.0 models/auto/configuration_auto.py:1433-1442 (4.57.1 words it the same).
    Signature("model_type_unknown", "transformers does not know the model type",
              (r"has model type `[^`\n]+` but Transformers does not recognize this architecture",),
              "rebuild the image from its lock: GLM-5 (glm_moe_dsa) needs transformers >= 5.2 over sglang's 4.57.1 pin",
              "transformers is older than the checkpoint"),
    # sglang 0.5.9 model_loader/loader.py:467-470 (DefaultModelLoader._prepare_weights).
    Signature("weights_missing", "the checkpoint has no weight files",
              (r"Cannot find any model weights with `[^`\n]*`",),
              "finish copying the checkpoint (*.safetensors, ~410-453 GB) into model.path",
              "config.json is there, the *.safetensors are not"),
    # sglang 0.5.9 model_loader/utils.py:53-60.
    Signature("arch_unsupported", "the checkpoint's architecture is not one sglang can run",
              (r"Cannot find model module\. '[^'\n]+' is not a registered model",),
              "use the GLM-5 NVFP4 checkpoint (architectures: GlmMoeDsaForCausalLM)",
              "config.json names another architecture"),
    # sglang 0.5.9 model_executor/model_runner.py:840-845.
    Signature("gpu_busy", "another process holds memory on some GPUs",
              (r"The memory capacity is unbalanced\. Some GPUs may be occupied by other processes",),
              "run nvidia-smi on the node and stop what holds GPU memory (an old server or benchmark)",
              "the GPUs do not have the same free memory"),
    # sglang 0.5.9 model_executor/cuda_graph_runner.py:369-374 (before cuda_oom: other advice).
    Signature("cuda_graph_oom", "out of GPU memory while capturing CUDA graphs",
              (r"Capture cuda graph failed: ",),
              "lower --cuda-graph-max-bs (e.g. 256) or --mem-fraction-static in server.flags",
              "CUDA graph capture needs memory beyond the KV cache"),
    # sglang 0.5.9 model_executor/model_runner_kv_cache_mixin.py:415-419.
    Signature("kv_cache_no_room", "no GPU memory left for the KV cache",
              (r"Not enough memory\. Please try to increase --mem-fraction-static",),
              "raise --mem-fraction-static (server.flags: the fraction covers weights and KV), or give the model "
              "more GPUs; check nothing else holds GPU memory",
              "after the weights, the memory fraction leaves no room for KV"),
    # torch 2.9.1 c10/cuda/CUDACachingAllocator.cpp (OutOfMemoryError) and CUDAException.cpp.
    Signature("cuda_oom", "CUDA out of memory",
              (r"CUDA out of memory\. Tried to allocate", r"CUDA error: out of memory"),
              "lower --mem-fraction-static (0.92 -> 0.88) or --max-running-requests in server.flags; check with "
              "nvidia-smi that no other process holds GPU memory (a previous server still running?)",
              "weights, KV cache and activations do not fit", implied_by=("cuda_graph_oom",)),
    # sglang 0.5.9 mem_cache/common.py:216-224, 284-292, 319-324, 410-418.
    Signature("kv_pool_exhausted", "the KV pool ran out while serving",
              # "Prefill out of...", "Decode out of...", "Out of...": one literal each, the fastest to search.
              (r"Out of memory\. Try to lower your batch size", r"out of memory\. Try to lower your batch size",
               r"Out of memory even after retracting", r"alloc_req_slots runs out of memory"),
              "lower --max-running-requests in server.flags, or raise --mem-fraction-static",
              "more requests and context than the KV pool holds"),
    # sglang 0.5.9 distributed/device_communicators/pynccl_wrapper.py:373-376 (NCCL v2.27.5
    # src/init.cc:2376-2388); torch 2.9.1 NCCLUtils.cpp (DistBackendError); NCCL checks.h:16.
    Signature("nccl_error", "NCCL failed to set up or run a collective",
              (r"RuntimeError: NCCL error: ", _then(r"NCCL error in: ", r"ProcessGroupNCCL\.cpp:\d"),
               r"Cuda failure (\d+ )?'peer access is not supported between these two devices'"),
              _P2P_FIX, "GPU peer-to-peer or IPC across the TP ranks failed (or /dev/shm is too small)"),
    # torch 2.9.1 torch/csrc/distributed/c10d/TCPStore.cpp.
    Signature("dist_init_timeout", "a TP rank never joined the process group",
              (r"Timed out after \d+ seconds waiting for clients\. \d+/\d+ clients joined",),
              "find the TP rank without `Init torch distributed ends` in the log and check its GPU",
              "one scheduler hung before the rendezvous"),
    # sglang 0.5.9 model_executor/model_runner.py:1069-1082 (480 s barrier).
    Signature("load_unbalanced", "one TP rank took far longer to load its weights",
              (r"could finish the model loading, but there are other ranks that didn't finish loading",),
              "put the checkpoint on fast local storage; read the other ranks' lines for a failure",
              "slow storage or a rank that died while loading"),
    # sglang 0.5.9 utils/watchdog.py:147-161 (default 300 s, server_args.py:359).
    Signature("scheduler_watchdog", "a forward pass took longer than sglang's watchdog allows",
              (r"Scheduler watchdog timeout \(self\.watchdog_timeout=[\d.]+",),
              "if it fired at the first request: FlashInfer was compiling its SM120 kernels; build them into the "
              "image (image.flashinfer_aot: profile, a base with nvcc) and raise --watchdog-timeout; if later, run "
              "`gpunode p2p` (a hung all-reduce)",
              "a JIT compile inside the warm-up, or a hung collective"),
    # torch 2.9.1 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (WorkNCCL::checkTimeout).
    Signature("nccl_watchdog", "an NCCL collective hung (torch's watchdog)",
              (r"Watchdog caught collective operation timeout: WorkNCCL\(",
               r"Some NCCL operations have failed or timed out"),
              _P2P_FIX, "an all-reduce hung for 10 min: a P2P path that drops data, or one rank stuck"),
    # flashinfer-python 0.6.3 jit/cpp_ext.py:56-59 (get_cuda_path).
    Signature("jit_no_nvcc", "FlashInfer needs nvcc to compile a kernel and the image has none",
              (r"Could not find nvcc and default cuda_home=",),
              "build the image on a base with CUDA 12.8's toolchain (image.base nvidia/cuda:12.8.1-cudnn-devel-"
              "ubuntu24.04) and let it build the profile's modules ahead of time (image.flashinfer_aot: profile)",
              "on SM120 FlashInfer ships no cubins; its kernels are compiled at first use"),
    # flashinfer-python 0.6.3 jit/cpp_ext.py:336-340 (run_ninja).
    Signature("jit_build_failed", "FlashInfer's JIT compile failed",
              (r"Ninja build failed\.",),
              "check CUDA_HOME and nvcc in the image (`gpunode image verify`): nvcc must compile for the GPUs' arch",
              "CUDA_HOME points at nothing usable, or nvcc is too old for the target"),
    # flashinfer-python 0.6.3 jit/core.py:289-295.
    Signature("jit_disabled", "a FlashInfer module is missing and JIT is disabled",
              (r"JIT compilation is disabled via FLASHINFER_DISABLE_JIT",),
              "build the module ahead of time (image.flashinfer_aot) or unset FLASHINFER_DISABLE_JIT",
              "the launch needs a module that was not built into the image"),
    # sglang 0.5.9 http_server.py:1758-1813 (the warm-up request's 600 s timeout).
    Signature("warmup_failed", "the warm-up request failed or timed out",
              (r"Initialization failed\. warmup error:",),
              "with a cold JIT cache the first request compiles FlashInfer's kernels: build them ahead of time "
              "(image.flashinfer_aot: profile) or raise SGLANG_WARMUP_TIMEOUT in server.env",
              "the first generation took longer than the warm-up allows, or failed"),
    # sglang 0.5.9 models/deepseek_common/attention_forward_methods/forward_mha.py:450
    # (FlashInfer MLA's PrefillMetadata has no page_table_1_flattened) and :451-453.
    Signature("page_table_1_flattened", "the FP8-KV MHA prefill path of sglang 0.5.9 (page_table_1_flattened)",
              (r"has no attribute 'page_table_1_flattened'",
               r"page_table_1_flattened should have been generated"),
              "keep --kv-cache-dtype bf16 or both --nsa-prefill-backend and --nsa-decode-backend trtllm (the profile "
              "sets both; check server.flags does not change them); --disable-chunked-prefix-cache also avoids it",
              "flashinfer attention with FP8 KV and a prefix of 8192+ tokens (radix hit or chunked prefill)"),
    # torch 2.9.1 aten/src/ATen/native/Distributions.cpp (multinomial); sglang 0.5.9 layers/sampler.py:66-72.
    Signature("nan_in_sampling", "NaN/inf in the logits",
              (r"probability tensor contains either .inf., .nan. or element < 0",
               r"Detected errors during sampling! NaN in the logits"),
              "keep --nsa-decode-backend trtllm and --nsa-prefill-backend trtllm, --kv-cache-dtype bf16 and "
              "--fp4-gemm-backend flashinfer_cudnn (flashinfer#2708); check server.flags does not override them",
              "NaN from the SM120 attention or FP4 GEMM kernels, or corrupted all-reduce data"),
    # uvicorn server.py:179-182 (inside the container), Docker's port allocator (outside).
    Signature("port_in_use", "the server port is taken",
              (_then(r"error while attempting to bind on address ", r": address already in use"),
               r"port is already allocated"),
              "stop what listens there (an old server container?) or choose another server.port",
              "another process holds the port"),
)
_BY_KEY = {signature.key: signature for signature in SIGNATURES}
_COMPILED = tuple((order, signature, tuple(re.compile(p) for p in signature.patterns))
                  for order, signature in enumerate(SIGNATURES))
_FRAME = re.compile(r'^\s*File "[^"]+", line \d+')
LINE_CHARS = 1000  # a finding's line: torch's OOM message alone is ~570 characters
ERROR_LINES = 5  # an unnamed failure shows the last five error lines
# A line cut at logread.LINE_CHARS loses the word it was cut in (up to this many characters): a
# secret cut in two would show its first part, which the secret itself no longer matches.
_CUT_WORD_CHARS = 256

# What a failing log shows besides the named messages: Python tracebacks and exceptions,
# argparse errors, the parent noticing a child died (sglang 0.5.9 engine.py, common.py). Each is
# searched for by a literal (fast), and where the literal is not all of it, its line is checked.
_EXCEPTION_LINE = re.compile(r"\w+(?:\.\w+)*(?:Error|Exception): ")  # at the start of the (stripped) line
_FAILED = re.compile(r"\bFAILED\b")
_ERRORISH: tuple[tuple[re.Pattern[str], Callable[[str], object] | None], ...] = (
    (re.compile(r"Traceback \(most recent call last\)"), None),
    (re.compile(r"Error: "), lambda line: _EXCEPTION_LINE.match(line.lstrip())),
    (re.compile(r"Exception: "), lambda line: _EXCEPTION_LINE.match(line.lstrip())),
    (re.compile(r": error: "), None),
    (re.compile(r"FAILED"), _FAILED.search),
    (re.compile(r"Received sigquit"), None),
    (re.compile(r"SIGQUIT received"), None),
)


def _without_cut_word(line: str) -> str:
    """A line as long as the cut leaves it, without the word the cut went through."""
    if len(line) < CUT_CHARS:
        return line
    tail = line[-_CUT_WORD_CHARS:]
    return line[:len(line) - len(tail) + max(tail.rfind(" "), tail.rfind("\t"), 0)]


def _shown(line: str, secrets: tuple[str, ...], limit: int) -> str:
    return redact(_without_cut_word(line).strip(), secrets)[:limit]


class Scan:
    """One pass over a log (``feed`` it ``logread.cut_lines``), keeping only what the findings need:
    the first line of each signature, the last error lines and the last non-blank line."""

    def __init__(self) -> None:
        self.first: dict[str, tuple[int, int, str]] = {}  # key -> (line number, table order, line)
        self.errors: deque[str] = deque(maxlen=ERROR_LINES)
        self.last_line = ""
        self.lines = 0
        self._previous: str | None = None  # the line before this chunk's first; None at the start of a window
        self._pending = list(_COMPILED)

    def feed(self, lines: list[str] | None) -> None:
        if lines is None:  # a window of the file ends: the next line does not follow this one
            self._previous = None
            return
        if not lines:
            return
        block = "\n".join(lines)
        for entry in list(self._pending):
            order, signature, regexes = entry
            starts = [start for regex in regexes if (start := self._first_line(regex, block)) is not None]
            if starts:
                start = min(starts)
                end = block.find("\n", start)
                self.first[signature.key] = (self.lines + block.count("\n", 0, start), order,
                                             block[start:end if end >= 0 else len(block)])
                self._pending.remove(entry)
        self._error_lines(block)
        for line in reversed(lines):
            if line.strip():
                self.last_line = line
                break
        self.lines += len(lines)
        self._previous = lines[-1]

    def _first_line(self, regex: re.Pattern[str], block: str) -> int | None:
        """Where the first line of ``block`` that ``regex`` matches starts, passing over a traceback's
        source lines (`raise X(f"...")`: the exception line below it says the same)."""
        at = 0
        while (found := regex.search(block, at)) is not None:
            start = block.rfind("\n", 0, found.start()) + 1
            previous = self._previous if start == 0 else block[block.rfind("\n", 0, start - 1) + 1:start - 1]
            if previous is None or not _FRAME.match(previous):
                return start
            end = block.find("\n", found.end())
            if end < 0:
                return None
            at = end + 1
        return None

    def _error_lines(self, block: str) -> None:
        found: dict[int, str] = {}
        for finder, check in _ERRORISH:
            at = 0
            while (hit := finder.search(block, at)) is not None:
                start = block.rfind("\n", 0, hit.start()) + 1
                end = block.find("\n", hit.end())
                end = len(block) if end < 0 else end
                if start not in found and (check is None or check(block[start:end])):
                    found[start] = block[start:end]
                at = end + 1
        self.errors.extend(found[start] for start in sorted(found)[-ERROR_LINES:])

    def findings(self, secrets: Iterable[str] = ()) -> list[Finding]:
        """Every named failure, ordered by the line where each first shows; symptoms that a finding
        explains are left out. Unnamed errors give one ``unknown`` finding; a healthy log none."""
        secrets = tuple(secrets)
        named = [key for key in sorted(self.first, key=lambda k: self.first[k][:2])
                 if not any(other in self.first for other in _BY_KEY[key].implied_by)]
        if named:
            return [Finding(key, FAIL, _BY_KEY[key].title, cause=_BY_KEY[key].cause, fix=_BY_KEY[key].fix,
                            evidence=_shown(self.first[key][2], secrets, LINE_CHARS)) for key in named]
        if not self.errors:
            return []
        return [Finding("unknown", FAIL, "a failure no signature names", cause="see the log lines",
                        fix="read the whole log (docker logs <container>); these are its last error lines",
                        evidence=redact(" | ".join(_without_cut_word(line).strip() for line in self.errors),
                                        secrets)[:1500])]

    def last_error_line(self, secrets: Iterable[str] = ()) -> str:
        """The last error-looking line, else the last line (redacted)."""
        line = self.errors[-1] if self.errors else self.last_line
        return _shown(line, tuple(secrets), 500) if line else "(no log output)"


def scan(chunks: Iterable[str | None]) -> Scan:
    """One pass over a log given in chunks (``logread.LogSource.chunks``)."""
    result = Scan()
    for lines in cut_lines(chunks):
        result.feed(lines)
    return result


def scan_text(text: str) -> Scan:
    return scan(text_chunks(text))


def match_signature(text: str) -> tuple[Signature, str] | None:
    """The signature of the failure that began first in ``text``, and the line that shows it."""
    named = [found for found in findings(text) if found.code != "unknown"]
    if not named:
        return None
    return _BY_KEY[named[0].code], named[0].evidence or ""


def findings(text: str, secrets: Iterable[str] = ()) -> list[Finding]:
    """Every named failure in a log, ordered by the line where each first shows (``Scan.findings``)."""
    return scan_text(text).findings(secrets)


def diagnose(log_text: str, exit_code: int | None = None, oom_killed: bool = False,
             secrets: Iterable[str] = ()) -> Diagnosis:
    """The failure that began first in a server's log, with its fix (what serve reports when a
    start fails). Always returns something."""
    secrets = tuple(secrets)
    result = scan_text(log_text)
    named = [f for f in result.findings(secrets) if f.code != "unknown"]
    if named:
        return Diagnosis(named[0].code, named[0].message, named[0].fix or "", named[0].evidence or "", exit_code)
    if oom_killed:
        return Diagnosis("host_oom", "the kernel's OOM killer stopped the server (host RAM, not GPU memory)",
                         "give the container more memory (container.memory_gb) or lower OMP_NUM_THREADS; "
                         "loading reads the ~410 GB checkpoint through host memory",
                         result.last_error_line(secrets), exit_code)
    return Diagnosis("unknown", f"the server exited{f' with status {exit_code}' if exit_code is not None else ''}",
                     "read the full log (docker logs <container>); the line below is the last error it printed",
                     result.last_error_line(secrets), exit_code)


# Docker's own refusals (moby and nvidia-container-toolkit messages), searched case-insensitively.
_DOCKER_ERRORS = {
    "nvidia_runtime_missing": _then(r"could not select device driver ", r" with capabilities: \[\[gpu\]\]"),
    "device_node_missing": r"error gathering device information|" + _then(r"no such file or directory", r"/dev/nvidia"),
    "memlock_not_permitted": r"error setting rlimit type 8|" + _then(r"setting rlimits", r"operation not permitted"),
    "port_in_use": r"port is already allocated|address already in use",
    "image_missing": r"No such image|pull access denied|not found: manifest unknown",
}
_DOCKER_COMPILED = {key: re.compile(pattern, re.IGNORECASE) for key, pattern in _DOCKER_ERRORS.items()}
_DOCKER_MESSAGE_CHARS = 16 * CUT_CHARS  # Docker's messages are a few lines; a longer one is cut first


def diagnose_docker_error(message: str, model_path: str = "", image: str = "") -> Diagnosis | None:
    """Docker refusing to create or start the container, in words, with the fix."""
    message = message[:_DOCKER_MESSAGE_CHARS]
    found = match_signature(message)
    if found:
        signature, line = found
        fix = signature.fix if not model_path else f"{signature.fix} (model.path: {model_path})"
        return Diagnosis(signature.key, signature.title, fix, line[:500])
    known = (
        ("nvidia_runtime_missing", "Docker has no NVIDIA runtime for --gpus",
         "install nvidia-container-toolkit on the node, or start with GPU device nodes instead"),
        ("device_node_missing", "an NVIDIA device node is missing on the node",
         "run the container and node stages again: /dev/nvidia* must exist inside the LXC container"),
        ("memlock_not_permitted", "Docker may not raise the locked-memory limit (memlock) that NCCL needs",
         ("the node lacks CAP_SYS_RESOURCE: make the LXC container privileged (container.unprivileged: false) or "
          "raise its limit (lxc.prlimit.memlock: unlimited in /etc/pve/lxc/<vmid>.conf)")),
        ("port_in_use", "the server port is taken on the node",
         "stop what listens there or choose another server.port"),
        ("image_missing", f"the image {image} is not on the node" if image else "the image is not on the node",
         "run the image stage (gpunode provision host.yml --tags image); images are built on the node, never pulled"),
    )
    for key, title, fix in known:
        if _DOCKER_COMPILED[key].search(message):
            return Diagnosis(key, title, fix, redact(message.strip())[:500])
    return None
