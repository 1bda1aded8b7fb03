"""Stacks as data: the two stacks, their profiles, the host file's choice, plan, and --ab image.stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpunode import derive

from gpunode.derive import plan

from gpunode.catalogue import profiles, stacks
from gpunode.bench.command import AB_PRESETS, parse_ab
from gpunode.bench.restart import overridden
from gpunode.hostfile import HostFileError, ImagePins, load
from gpunode.catalogue import aot
from gpunode.derive.imagecontext import collect_inputs, lock_pin_mismatches, lock_versions
from gpunode.catalogue.sglangargs import ARGS_DIR
from gpunode_lab.contract import STANDIN

ROOT = Path(__file__).resolve().parents[2]
FAKES = STANDIN  # the stand-in server the lab ships
CURRENT = "sglang-0.5.23-cu130"


def lab_file(tmp_path: Path, image: dict | None = None, server: dict | None = None, driver: str | None = None) -> Path:
    data = yaml.safe_load((ROOT / "inventory" / "lab" / "host.yml").read_text())
    host = data["hosts"][0]
    host["image"].update(image or {})
    server = dict(server or {})
    host["server"]["flags"].update(server.pop("flags", {}))
    host["server"].update(server)
    if driver:
        host["driver"]["version"] = driver
    path = tmp_path / "host.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def real_flags(version: str) -> set[str]:
    data = json.loads((ARGS_DIR / f"sglang_{version.replace('.', '_')}_args.json").read_text())
    assert data["source"].startswith(f"sglang {version} ")
    return {flag for action in data["actions"] for flag in action["flags"]}


@pytest.mark.parametrize("name", stacks.available())
def test_each_stack_names_its_profile_and_its_locks_hold_its_pins(name: str) -> None:
    stack = stacks.load(name)
    assert profiles.load(stack.profile).stack == name
    for lock in stack.locks.values():
        assert lock_pin_mismatches((stack.folder / lock).read_text(), stack.versions(), stack) == []
    pinned = {line.split("==")[0].split("[")[0]: line.split("==")[1]
              for line in (stack.folder / "requirements.in").read_text().splitlines() if "==" in line}
    assert pinned["sglang"] == stack.pins["sglang"].version and pinned["torch"] == stack.pins["torch"].version
    # `gpunode check` has one image test per pin name of the host file (ImagePins): a stack's pin
    # outside them would go unchecked on the node.
    assert set(stack.pins) <= set(ImagePins.model_fields)


def test_the_current_stacks_lock_is_cuda_13_0_throughout() -> None:
    stack = stacks.load(CURRENT)
    versions = lock_versions((stack.folder / "requirements.lock").read_text())
    # nvcc pinned to torch's CUDA, not the 13.5 an unpinned dependency would pull.
    assert versions["cuda-toolkit"] == "13.0.3.0" and versions["nvidia-cuda-nvcc"].startswith("13.0.")
    assert versions["sgl-deep-gemm"] == "0.2.3.post2" and "flashinfer-cubin" not in versions
    assert versions["datasets"].split(".")[0] >= "4"
    assert len(versions) == 207


@pytest.mark.parametrize("profile_name", profiles.available())
def test_every_profile_flag_is_one_its_stacks_sglang_accepts(profile_name: str) -> None:
    profile = profiles.load(profile_name)
    accepted = real_flags(stacks.load(profile.stack).pins["sglang"].version)
    assert [f.flag for f in profile.flags if f.flag not in accepted] == []


def test_the_flags_changed_between_the_stacks() -> None:
    old, new = real_flags("0.5.9"), real_flags("0.5.23")
    assert {"--nsa-decode-backend", "--nsa-prefill-backend", "--cuda-graph-max-bs"} <= old - new
    assert {"--dsa-decode-backend", "--dsa-prefill-backend", "--cuda-graph-max-bs-decode"} <= new - old
    current = {f.flag: f.value for f in profiles.load("glm5-nvfp4-sm120-current").flags}
    assert current["--kv-cache-dtype"] == "fp8_e4m3" and current["--cuda-graph-max-bs-decode"] == 256
    assert "--disable-cuda-graph" not in current and "--disable-radix-cache" not in current
    assert not any(flag.startswith("--speculative") for flag in current)


def test_a_host_picks_the_current_stack_and_gets_its_profile_base_and_modules(tmp_path: Path) -> None:
    host = load(lab_file(tmp_path, {"stack": CURRENT})).hosts[0]
    assert host.profile_name == "glm5-nvfp4-sm120-current"
    assert host.image.pinned()["sglang"] == "0.5.23" and host.image.base_name == "debootstrap"
    planned = derive.aot_plan(host)
    assert planned.arch.cuda_arch == "12.0f"  # FlashInfer 0.7.2's SM 12.0 target on CUDA >= 12.9
    assert [m.name for m in planned.modules] == ["sparse_mla_sm120", "fp4_quantization_120f", "fp4_gemm_cutlass_sm120",
                                                 "fused_moe_120", "sampling"]
    section = plan.image_section(host)
    assert (section["stack"], section["stack_cuda"], section["stack_driver_min"]) == (CURRENT, "13.0", 580)
    assert section["toolchain"].startswith("stack-cuda-13.0: CUDA 13.0 at /usr/local/cuda-13.0")
    assert any("DeepGEMM" in item["what"] for item in section["jit_only"])
    inputs = collect_inputs(host.image, aot=planned)
    assert inputs.tag.startswith("gpunode/sglang:0.5.23-cu130-") and inputs.patches == ()
    assert "/usr/local/cuda-13.0/lib64/stubs/libcuda.so" in inputs.dockerfile
    assert 'org.gpunode.stack="sglang-0.5.23-cu130"' in inputs.dockerfile
    # The stand-in parses the launch as the stack's sglang would.
    assert derive.server_launch(host).env["FAKE_SGLANG_VERSION"] == "0.5.23"


@pytest.mark.parametrize(("image", "server", "driver", "message"), [
    ({"stack": CURRENT}, {}, "575.64.05",
     "driver.version 575.64.05 is older than 580: stack sglang-0.5.23-cu130 (CUDA 13.0) needs >= 580"),
    ({"stack": CURRENT}, {"profile": "glm5-nvfp4-sm120"}, None,
     "server.profile glm5-nvfp4-sm120 runs on stack sglang-0.5.9-cu128, but image.stack is sglang-0.5.23-cu130"),
    ({"stack": "sglang-0.6"}, {}, None, "unknown stack 'sglang-0.6'"),
    ({"pins": {"deep_gemm": "0.2.3"}}, {}, None, "stack sglang-0.5.9-cu128 has no pin deep_gemm"),
    ({"stack": CURRENT, "toolchain": "pypi-cuda-13.0"}, {}, None,
     "image.toolchain pypi-cuda-13.0: stack sglang-0.5.23-cu130 brings its own (stack-cuda-13.0)"),
])
def test_a_host_file_that_does_not_fit_its_stack_is_refused(tmp_path: Path, image: dict, server: dict,
                                                            driver: str | None, message: str) -> None:
    with pytest.raises(HostFileError) as caught:
        load(lab_file(tmp_path, image, server, driver))
    assert any(message in problem for problem in caught.value.problems), caught.value.problems


def test_the_seeds_stack_still_serves_with_570() -> None:
    assert stacks.load(stacks.DEFAULT).driver_min == 570


def test_ab_image_stack_swaps_the_stack_and_its_profile(tmp_path: Path) -> None:
    spec = parse_ab(AB_PRESETS["stacks"])
    assert spec.flag == "image.stack" and spec.values == ("sglang-0.5.9-cu128", CURRENT)
    with pytest.raises(ValueError, match="unknown stack sglang-9"):
        parse_ab("image.stack=sglang-0.5.9-cu128,sglang-9")
    host = load(lab_file(tmp_path, server={"flags": {"--max-running-requests": 64}})).hosts[0]
    other = overridden(host, {"image.stack": CURRENT})
    assert other.profile_name == "glm5-nvfp4-sm120-current" and other.server.flags == {"--tp-size": 2, "--max-running-requests": 64}
    assert derive.server_launch(other).value_of("--dsa-decode-backend") is not None
    back = overridden(other, {"image.stack": "sglang-0.5.9-cu128"})
    assert back.profile_name == "glm5-nvfp4-sm120"


def test_the_cli_help_names_every_ab_preset() -> None:
    from gpunode.cli import AB_PRESETS_HELP

    assert [item.split(" ")[0] for item in AB_PRESETS_HELP] == list(AB_PRESETS)
    for item in AB_PRESETS_HELP:
        name, shown = item.split(" ", 1)
        key, values = AB_PRESETS[name].split("=")
        assert shown == f"({key} {values})"


def test_the_aot_rules_read_the_stacks_parser_defaults() -> None:
    stack, profile = stacks.load(CURRENT), profiles.load("glm5-nvfp4-sm120-current")
    without = [m.name for m in aot.profile_modules(stack, profile, {"--fp4-gemm-backend": False})]
    assert "fp4_gemm_cutlass_sm120" in without  # unset: the default, flashinfer_cutlass
    cudnn = [m.name for m in aot.profile_modules(stack, profile, {"--fp4-gemm-backend": "flashinfer_cudnn"})]
    assert "fp4_gemm_cutlass_sm120" not in cudnn
