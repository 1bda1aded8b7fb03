"""Every signature of gpunode.stages.serve.diagnose against the exact text the real component prints.

Each text below was read from the named source (package, version, file:line) or reproduced in the
sglang 0.5.9 image on this machine (CUDA's initialisation with a stand-in libcuda whose cuInit
returns the code named; transformers and the loader with SGLANG_USE_CPU_ENGINE=1). C++ messages
(torch, NCCL) are from the libraries' strings; their numbers are illustrative.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode.stages.serve import diagnose as d

ROOT = Path(__file__).resolve().parents[2]
SITE = "/opt/sglang/lib/python3.11/site-packages"

REAL: list[tuple[str, str]] = [
    # Python argparse via sglang 0.5.9 server_args.py:5592 (reproduced: exit 2).
    ("bad_argument", "launch_server.py: error: unrecognized arguments: --disable-radix-cahce"),
    ("bad_argument", "launch_server.py: error: argument --kv-cache-dtype: invalid choice: 'bf61' (choose from "
                     "'auto', 'fp8_e5m2', 'fp8_e4m3', 'bf16', 'bfloat16', 'fp4_e2m1')"),
    ("bad_argument", "launch_server.py: error: argument --tensor-parallel-size/--tp-size: invalid int value: '8x'"),
    # torch 2.9.1 c10/cuda/CUDAFunctions.cpp:58, warned at :119 (reproduced, cuInit -> 3).
    ("cuda_init_hmm", f"{SITE}/torch/cuda/__init__.py:182: UserWarning: CUDA initialization: CUDA driver "
                      "initialization failed, you might not have a CUDA gpu. (Triggered internally at "
                      "/pytorch/c10/cuda/CUDAFunctions.cpp:119.)"),
    # torch 2.9.1 c10/cuda/CUDAFunctions.cpp:63 (reproduced, cuInit -> 999).
    ("cuda_unknown_error", "UserWarning: CUDA initialization: CUDA unknown error - this may be due to an incorrectly "
                           "set up environment, e.g. changing env variable CUDA_VISIBLE_DEVICES after program start. "
                           "Setting the available devices to be zero. (Triggered internally at "
                           "/pytorch/c10/cuda/CUDAFunctions.cpp:119.)"),
    # torch 2.9.1 c10/cuda/CUDAFunctions.cpp:94 (reproduced, cuInit -> 803 and 804).
    ("cuda_driver_mismatch", "UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you "
                             "run some cuda functions before calling NumCudaDevices() that might have already set an "
                             "error? Error 803: system has unsupported display driver / cuda driver combination "
                             "(Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:119.)"),
    ("cuda_driver_mismatch", "UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you "
                             "run some cuda functions before calling NumCudaDevices() that might have already set an "
                             "error? Error 804: forward compatibility was attempted on non supported HW "
                             "(Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:119.)"),
    # sglang 0.5.9 utils/common.py:2059 (reproduced without libcuda).
    ("no_gpu_visible", "RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA) is available."),
    # sglang 0.5.9 utils/common.py:1757-1760.
    ("nvidia_smi_missing", "RuntimeError: nvidia-smi not found. Ensure NVIDIA drivers are installed and accessible."),
    # transformers 5.2.0 models/auto/configuration_auto.py:1445-1448 (reproduced, empty folder).
    ("model_dir_empty", "ValueError: Unrecognized model in /model. Should have a `model_type` key in its config.json."),
    # transformers 5.2.0 utils/hub.py:468 (reproduced).
    ("model_path_missing", "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
                           "'namespace/repo_name': '/models/does_not_exist'. Use `repo_type` argument if needed."),
    # transformers 5.2.0 utils/hub.py:493-497 (reproduced, hub id with HF_HUB_OFFLINE=1).
    ("model_not_cached_offline", "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and "
                                 "couldn't find them in the cached files."),
    # moby volume/mounts/errors.go errBindSourceDoesNotExist.
    ("bind_source_missing", 'Error response from daemon: invalid mount config for type "bind": bind source path does '
                            "not exist: /models/GLM-5-NVFP4"),
    # transformers 5.2.0 configuration_utils.py:665 (reproduced).
    ("config_not_json", "OSError: It looks like the config file at '/model/config.json' is not a valid JSON file."),
    # transformers 5.2.0 models/auto/configuration_auto.py:1433-1442 (reproduced).
    ("model_type_unknown", "ValueError: The checkpoint you are trying to load has model type `glm_moe_dsa` but "
                           "Transformers does not recognize this architecture. This could be because of an issue with "
                           "the checkpoint, or because your version of Transformers is out of date."),
    # sglang 0.5.9 model_loader/loader.py:467-470 (reproduced).
    ("weights_missing", "RuntimeError: Cannot find any model weights with `/model`"),
    # sglang 0.5.9 model_loader/utils.py:53-60 (reproduced).
    ("arch_unsupported", "ValueError: Cannot find model module. 'FooBarForCausalLM' is not a registered model in the "
                         "Transformers library (only relevant if the model is meant to be in Transformers) and "
                         "'AutoModel' is not present in the model config's 'auto_map' (relevant if the model is "
                         "custom)."),
    # sglang 0.5.9 model_executor/model_runner.py:840-845.
    ("gpu_busy", "RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
                 "min_per_gpu_memory=60.1, local_gpu_memory=94.9, local_gpu_memory * 0.9=85.4"),
    # sglang 0.5.9 model_executor/cuda_graph_runner.py:369-374.
    ("cuda_graph_oom", "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 1.00 GiB."),
    # sglang 0.5.9 model_executor/model_runner_kv_cache_mixin.py:415-419.
    ("kv_cache_no_room", "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current "
                         "value: self.server_args.mem_fraction_static=0.92"),
    # torch 2.9.1 c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator::malloc).
    ("cuda_oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity "
                 "of 94.97 GiB of which 1.06 GiB is free. Process 41234 has 93.90 GiB memory in use. Of the allocated "
                 "memory 92.10 GiB is allocated by PyTorch, and 311.52 MiB is reserved by PyTorch but unallocated. If "
                 "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                 "to avoid fragmentation.  See documentation for Memory Management  "
                 "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"),
    # torch 2.9.1 c10/cuda/CUDAException.cpp (c10_cuda_check_implementation).
    ("cuda_oom", "torch.AcceleratorError: CUDA error: out of memory"),
    # sglang 0.5.9 mem_cache/common.py:216-224, :319-324.
    ("kv_pool_exhausted", "RuntimeError: Prefill out of memory. Try to lower your batch size."),
    ("kv_pool_exhausted", "RuntimeError: alloc_req_slots runs out of memory. Please set a smaller number for "
                          "`--max-running-requests`."),
    # sglang 0.5.9 pynccl_wrapper.py:373-376; NCCL 2.27.5 src/init.cc:2376.
    ("nccl_error", "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)"),
    # torch 2.9.1 NCCLUtils.cpp (C10D_NCCL_CHECK); NCCL src/include/checks.h:16.
    ("nccl_error", "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
                   "ProcessGroupNCCL.cpp:3356, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL "
                   "version 2.27.5"),
    ("nccl_error", "Cuda failure 'peer access is not supported between these two devices'"),
    # torch 2.9.1 torch/csrc/distributed/c10d/TCPStore.cpp.
    ("dist_init_timeout", "torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. 7/8 "
                          "clients joined."),
    # sglang 0.5.9 model_executor/model_runner.py:1069-1082.
    ("load_unbalanced", "ValueError: TP rank 0 could finish the model loading, but there are other ranks that didn't "
                        "finish loading. It is likely due to unexpected failures (e.g., OOM) or a slow node."),
    # sglang 0.5.9 utils/watchdog.py:147-161.
    ("scheduler_watchdog", "[2026-12-01 07:40:01 TP3] Scheduler watchdog timeout (self.watchdog_timeout=300, "
                           "self.soft=False)"),
    # torch 2.9.1 ProcessGroupNCCL.cpp (WorkNCCL::checkTimeout, handleException).
    ("nccl_watchdog", "[rank1]:[E1201 07:35:43.221307236 ProcessGroupNCCL.cpp:685] [PG ID 2 PG GUID 3(TP) Rank 1] "
                      "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, "
                      "NumelOut=1, Timeout(ms)=600000) ran for 600083 milliseconds before timing out."),
    ("nccl_watchdog", "Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, "
                      "subsequent GPU operations might run on corrupted/incomplete data."),
    # flashinfer-python 0.6.3 jit/cpp_ext.py:56-59 (reproduced in the image without nvcc).
    ("jit_no_nvcc", "RuntimeError: Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist"),
    # flashinfer-python 0.6.3 jit/cpp_ext.py:336-340 (reproduced).
    ("jit_build_failed", "RuntimeError: Ninja build failed. Ninja output:"),
    # flashinfer-python 0.6.3 jit/core.py:289-295 (reproduced).
    ("jit_disabled", "flashinfer.jit.core.MissingJITCacheError: JIT compilation is disabled via FLASHINFER_DISABLE_JIT "
                     "environment variable, but the required module is not found in the JIT cache. Please add the "
                     "missing module to the JIT cache build configuration."),
    # sglang 0.5.9 entrypoints/http_server.py:1758-1813.
    ("warmup_failed", "Initialization failed. warmup error: requests.exceptions.ReadTimeout: "
                      "HTTPConnectionPool(host='127.0.0.1', port=30000): Read timed out. (read timeout=600)"),
    # sglang 0.5.9 forward_mha.py:450 (the wording reproduced in Python 3.11), and :451-453.
    ("page_table_1_flattened", "AttributeError: 'PrefillMetadata' object has no attribute 'page_table_1_flattened'"),
    ("page_table_1_flattened", "AssertionError: page_table_1_flattened should have been generated for FP8 MHA path"),
    # torch 2.9.1 aten/src/ATen/native/Distributions.cpp (multinomial); sglang layers/sampler.py:66-72.
    ("nan_in_sampling", "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0"),
    ("nan_in_sampling", "[2026-12-01 07:41:00 TP0] Detected errors during sampling! NaN in the logits."),
    # uvicorn server.py:179-182 (reproduced); Docker's port allocator.
    ("port_in_use", "[2026-12-01 07:39:14] ERROR:    [Errno 98] error while attempting to bind on address "
                    "('0.0.0.0', 30000): address already in use"),
    ("port_in_use", "driver failed programming external connectivity on endpoint gpunode-sglang: Bind for "
                    "127.0.0.1:30000 failed: port is already allocated"),
]


@pytest.mark.parametrize(("key", "text"), REAL, ids=[f"{k}-{i}" for i, (k, _) in enumerate(REAL)])
def test_each_real_message_is_named(key: str, text: str) -> None:
    found = d.findings(text)
    assert [f.code for f in found] == [key]
    assert found[0].evidence == text.strip() and found[0].fix and found[0].cause


def test_every_signature_has_a_real_message() -> None:
    assert {key for key, _ in REAL} == {s.key for s in d.SIGNATURES}


# Texts the old table matched that no component of this stack prints (the stand-in used to print them).
NOT_REAL = [
    "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
    "NumCudaDevices() that might have already set an error? Error 3: initialization error",
    "AttributeError: 'NSAMetadata' object has no attribute 'page_table_1_flattened'",
]


def test_impossible_texts_from_the_old_stand_in_are_not_signatures() -> None:
    assert [f.code for f in d.findings(NOT_REAL[0])] == ["unknown"]
    # 'NSAMetadata' declares the field (nsa_backend.py:140); the attribute name alone still names the bug.
    assert [f.code for f in d.findings(NOT_REAL[1])] == ["page_table_1_flattened"]


def test_findings_are_ordered_where_the_failure_began_and_symptoms_are_left_out() -> None:
    log = "\n".join([
        "[2026-12-01 07:30:00] server_args=ServerArgs(model_path='/model', api_key='s3cret', ...)",
        f"{SITE}/torch/cuda/__init__.py:182: UserWarning: CUDA initialization: CUDA driver initialization failed, "
        "you might not have a CUDA gpu. (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:119.)",
        "Traceback (most recent call last):",
        "RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA) is available.",
    ])
    assert [f.code for f in d.findings(log)] == ["cuda_init_hmm"]  # no_gpu_visible follows from it
    later = "RuntimeError: Cannot find any model weights with `/model`\n" + \
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: 0.9"
    assert [f.code for f in d.findings(later)] == ["weights_missing", "kv_cache_no_room"]


def test_a_healthy_log_has_no_findings_and_an_unnamed_failure_is_unknown() -> None:
    healthy = "[2026-12-01 07:30:00] Load weight end. elapsed=57.31 s\n[2026-12-01 07:31:00] The server is fired up " \
              "and ready to roll!\n[2026-12-01 07:31:01] INFO:     127.0.0.1:5 - \"GET /health HTTP/1.1\" 200 OK"
    assert d.findings(healthy) == []
    broken = "[x TP0] Scheduler hit an exception: Traceback (most recent call last):\n  File \"a.py\", line 1\n" \
             "KeyError: 'rope_theta'\n[x] Received sigquit from a child process. It usually means the child failed."
    (unknown,) = d.findings(broken)
    assert unknown.code == "unknown" and "KeyError: 'rope_theta'" in unknown.evidence and "Received sigquit" in unknown.evidence


def test_secrets_never_reach_a_finding() -> None:
    log = "server_args=ServerArgs(api_key='s3cret-key')\nRuntimeError: Not enough memory. Please try to increase " \
          "--mem-fraction-static. s3cret-key"
    assert "s3cret-key" not in json.dumps([f.as_dict() for f in d.findings(log, secrets=("s3cret-key",))])


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpunode", "diagnose", *args], input=stdin, capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


def test_diagnose_cli_json_from_stdin() -> None:
    log = "\n".join(text for key, text in REAL if key in ("weights_missing", "nccl_watchdog"))
    result = run_cli("-", "--json", stdin=log)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [f["id"] for f in data["findings"]] == ["weights_missing", "nccl_watchdog"]
    assert set(data["findings"][0]) == {"id", "summary", "cause", "fix", "line"}


def test_diagnose_cli_healthy_unknown_and_bad_input(tmp_path: Path) -> None:
    healthy = tmp_path / "ok.log"
    healthy.write_text("The server is fired up and ready to roll!\n")
    result = run_cli(str(healthy), "--json")
    assert (result.returncode, json.loads(result.stdout)) == (0, {"findings": []})
    unknown = run_cli("-", stdin="Traceback (most recent call last):\nKeyError: 'x'\n")
    assert unknown.returncode == 1 and "unknown" in unknown.stdout
    missing = run_cli(str(tmp_path / "nope.log"))
    assert missing.returncode == 2 and "nope.log" in missing.stderr


def test_the_stand_ins_failure_texts_are_the_real_ones() -> None:
    """Each failure the lab's stand-in server can be told to have prints one of the texts above."""
    from gpunode_lab.standin.sglang_server import TRACEBACKS

    real = {text for _, text in REAL}
    for crash, (_phase, _who, lines) in TRACEBACKS.items():
        found = d.findings("\n".join(lines))
        assert found and found[0].code != "unknown", crash
        assert found[0].evidence in real, (crash, found[0].evidence)
