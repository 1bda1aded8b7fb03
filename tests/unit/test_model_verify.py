"""The model stage's verify (gpunode.stages.model.verify): each way a checkpoint can be not whole is a
finding naming its file and the fix; a whole one passes; ``sizes`` hashes only what changed since
it was last found equal, ``full`` everything. Checkpoints made with the real safetensors library."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from gpunode.stages.model import manifest as manifests
from gpunode.stages.model.verify import FIXES, git_blob_id, verify

ARCH, QUANT = "GlmMoeDsaForCausalLM", {"quant_method": "modelopt", "quant_algo": "NVFP4"}


def make(folder: Path, shards: int = 3) -> manifests.Manifest:
    """A tiny GLM-5-NVFP4-like checkpoint and the manifest the Hub's listing would give for it."""
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for k in range(1, shards + 1):
        name = f"model-{k:05d}-of-{shards:05d}.safetensors"
        tensors = {f"model.layers.{k}.mlp.experts.0.gate_proj.weight": np.full((64, 32), k, dtype=np.uint8),
                   f"model.layers.{k}.input_layernorm.weight": np.arange(64, dtype=np.float32)}
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        weight_map.update({tensor: name for tensor in tensors})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({"architectures": [ARCH], "model_type": "glm_moe_dsa",
                                                    "quantization_config": QUANT}))
    files = []
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        lfs = path.suffix == ".safetensors"
        files.append(manifests.FileEntry(path.name, path.stat().st_size,
                                         hashlib.sha256(path.read_bytes()).hexdigest() if lfs else None,
                                         None if lfs else git_blob_id(path)))
    return manifests.Manifest("org/m", "a" * 40, files)


def check(folder: Path, man: manifests.Manifest | None, level: str = "sizes", source: str = "hub"):
    return verify(folder, manifest=man, level=level, workers=2, source=source, architecture=ARCH, quantization=QUANT)


SHARD = "model-00002-of-00003.safetensors"


def test_a_whole_checkpoint_passes_and_is_hashed_once(tmp_path: Path) -> None:
    man = make(tmp_path / "w")
    first = check(tmp_path / "w", man)
    assert first.ok and first.files == 5 and first.hashed_files == 5
    man.stamps = first.stamps
    again = check(tmp_path / "w", man)
    assert again.ok and again.hashed_files == 0, "sizes: an unchanged file is not hashed again"
    full = check(tmp_path / "w", man, "full")
    assert full.ok and full.hashed_files == 5 and full.hashed_bytes == full.bytes


@pytest.mark.parametrize("damage,code", [
    ("delete", "missing"), ("truncate", "size"), ("flip", "sha256"), ("link", "not_a_file")])
def test_each_damage_is_named_with_its_file_and_fix(tmp_path: Path, damage: str, code: str) -> None:
    man = make(tmp_path / "w")
    man.stamps = check(tmp_path / "w", man).stamps  # verified once: sizes mode trusts the stamps
    shard = tmp_path / "w" / SHARD
    if damage == "delete":
        shard.unlink()
    elif damage == "truncate":
        os.truncate(shard, shard.stat().st_size - 100)
    elif damage == "flip":
        with open(shard, "r+b") as handle:  # one byte, the size unchanged
            handle.seek(shard.stat().st_size - 1)
            last = handle.read(1)
            handle.seek(-1, os.SEEK_CUR)
            handle.write(bytes([last[0] ^ 0x01]))
    else:
        target = tmp_path / "elsewhere.safetensors"
        shard.rename(target)
        shard.symlink_to(target)
    report = check(tmp_path / "w", man)
    assert not report.ok and report.bad_files == [SHARD]
    finding = next(f for f in report.findings if f.code == code)
    assert finding.subject == SHARD and finding.fix == FIXES["hub"]


def test_a_flipped_byte_with_its_times_set_back_is_found_by_full_only(tmp_path: Path) -> None:
    man = make(tmp_path / "w")
    man.stamps = check(tmp_path / "w", man).stamps
    shard = tmp_path / "w" / SHARD
    st = shard.stat()
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    with open(shard, "r+b") as handle:
        handle.write(data)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    # ctime moved (no user can set it back): sizes hashes it again and finds it.
    assert check(tmp_path / "w", man).bad_files == [SHARD]
    assert check(tmp_path / "w", man, "full").bad_files == [SHARD]


def test_without_a_manifest_the_index_and_headers_still_find_a_short_shard(tmp_path: Path) -> None:
    make(tmp_path / "w")
    assert check(tmp_path / "w", None, source="node_path").ok
    shard = tmp_path / "w" / SHARD
    os.truncate(shard, shard.stat().st_size - 8)
    report = check(tmp_path / "w", None, source="node_path")
    assert [(f.code, f.subject) for f in report.findings] == [("header", SHARD)]
    assert report.findings[0].fix == FIXES["node_path"]


def test_the_index_names_a_missing_shard_and_a_missing_tensor(tmp_path: Path) -> None:
    make(tmp_path / "w")
    index = tmp_path / "w" / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["model.layers.9.extra.weight"] = "model-00001-of-00003.safetensors"
    data["weight_map"]["model.norm.weight"] = "model-00004-of-00003.safetensors"
    index.write_text(json.dumps(data))
    report = check(tmp_path / "w", None, source="host_path")
    lines = sorted(f.line() for f in report.findings)
    assert any("model-00004-of-00003.safetensors" in line and line.startswith("missing") for line in lines)
    assert any("'model.layers.9.extra.weight'" in line and line.startswith("index model-00001") for line in lines)


def test_an_index_path_that_leaves_the_folder_is_refused(tmp_path: Path) -> None:
    make(tmp_path / "w")
    index = tmp_path / "w" / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"x": "../../etc/passwd"}}))
    report = check(tmp_path / "w", None, source="host_path")
    assert any(f.code == "index" and "outside the weights folder" in f.message for f in report.findings)


@pytest.mark.parametrize("config,needle", [
    ({"architectures": ["GlmMoeForCausalLM"], "quantization_config": QUANT}, "architectures[0] is 'GlmMoeForCausalLM'"),
    ({"architectures": [ARCH], "quantization_config": {"quant_method": "fp8"}}, "quant_method is 'fp8'"),
    ({"architectures": [ARCH]}, "quant_algo is None"),
])
def test_config_names_the_architecture_and_quantization(tmp_path: Path, config: dict, needle: str) -> None:
    man = make(tmp_path / "w")
    (tmp_path / "w" / "config.json").write_text(json.dumps(config))
    report = check(tmp_path / "w", None, source="host_path")
    assert any(f.code == "config" and needle in f.message for f in report.findings), [f.line() for f in report.findings]
    assert man.files  # the manifest was made (the hub case is above)


def test_a_manifest_is_kept_atomically_and_refuses_another_revision(tmp_path: Path) -> None:
    man = make(tmp_path / "w")
    path = tmp_path / "rev.manifest.json"
    manifests.save(path, man)
    assert manifests.load(path, "org/m", "a" * 40) == man
    with pytest.raises(manifests.ManifestError, match="is for 'org/m'"):
        manifests.load(path, "org/m", "b" * 40)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a//b", "a/./b", "a\\b", ""])
def test_a_repo_path_that_leaves_the_folder_is_not_a_manifest_entry(path: str) -> None:
    with pytest.raises(manifests.ManifestError):
        manifests.FileEntry(path, 1, None, "0" * 40)


@pytest.mark.parametrize(("sha256", "blob"), [("../../../etc/cron.d/x", None), ("A" * 64, None), ("0" * 63, None),
                                              (None, "../x"), (None, "0" * 41)])
def test_a_listed_hash_that_is_not_a_hash_is_not_a_manifest_entry(sha256: str | None, blob: str | None) -> None:
    # the listed hash names the partial file: a hostile mirror's oid must not become a path
    with pytest.raises(manifests.ManifestError, match="hex digits"):
        manifests.FileEntry("model-00001-of-00003.safetensors", 1, sha256, blob)


@pytest.mark.parametrize("kind", ["fifo", "link", "folder"])
def test_a_config_that_is_not_a_file_is_named_and_never_opened(tmp_path: Path, kind: str) -> None:
    make(tmp_path / "w")
    config = tmp_path / "w" / "config.json"
    config.unlink()
    if kind == "fifo":
        os.mkfifo(config)  # opening it would wait for a writer forever
    elif kind == "link":
        config.symlink_to("/dev/zero")
    else:
        config.mkdir()
    report = check(tmp_path / "w", None, source="node_path")
    assert any(f.code == "config" and "not a regular file" in f.message for f in report.findings), report.findings


def test_a_manifest_that_is_not_a_file_is_refused_unopened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "rev.manifest.json")
    with pytest.raises(manifests.ManifestError, match="not a regular file"):
        manifests.load(tmp_path / "rev.manifest.json", "org/m", "a" * 40)
