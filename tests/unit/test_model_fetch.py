"""The model stage's fetch (gpunode.stages.model.fetch, and its command) with the real huggingface_hub
client against the lab's Hub stand-in (gpunode_lab.hub) on loopback: a fresh store is fetched whole
and verified; a converged one needs no request at all; a deleted, truncated or flipped shard is named
and fetched again alone; a cut connection ends whole; an unreachable Hub, an unknown
revision, a refused token and a store too small each fail fast with both facts named, the token in
no output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpunode.stages.model import fetch
from gpunode_lab import checkpoint
from gpunode_lab.hub import Hub

REPO = "lukealonso/GLM-5-NVFP4"
SHARD = "model-00002-of-00003.safetensors"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _offline_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No user's cache, token or telemetry: the client talks to the stand-in only."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)


@pytest.fixture
def hub(tmp_path: Path):
    made = checkpoint.make(tmp_path / "hub" / REPO, shards=3, shard_bytes=256 * 1024)
    with Hub(tmp_path / "hub", page_size=2) as running:
        running.commit = made["commit"]  # type: ignore[attr-defined]
        yield running


def plan(tmp_path: Path, hub: Any, **over: Any) -> fetch.Plan:
    base = tmp_path / "store" / REPO.replace("/", "--")
    values = dict(repo=REPO, revision=hub.commit, endpoint=hub.url, weights_dir=base / hub.commit,
                  manifest=base / f"{hub.commit}.manifest.json", verify="sizes", workers=4,
                  architecture="GlmMoeDsaForCausalLM", quantization={"quant_method": "modelopt", "quant_algo": "NVFP4"})
    values.update(over)
    return fetch.Plan(**values)


def repo_files(tmp_path: Path) -> list[Path]:
    """The repo's files as the stand-in serves them (its own .hub* cache files are not repo content)."""
    return [f for f in (tmp_path / "hub" / REPO).iterdir() if f.is_file() and not f.name.startswith(".hub")]


def bodies(hub: Any) -> list[str]:
    """The files whose bytes were sent (GETs of a file with a body)."""
    return sorted({e["file"] for e in hub.log() if e["method"] == "GET" and e.get("file") and e["bytes_sent"]})


def converge(p: fetch.Plan, token: str | None = None, lines: list | None = None) -> dict[str, Any]:
    return fetch.converge(p, token, False, (lines if lines is not None else []).append)


def test_a_fresh_store_is_fetched_whole_and_a_converged_one_needs_no_request(tmp_path: Path, hub: Any) -> None:
    p = plan(tmp_path, hub)
    first = converge(p)
    assert first["changed"] and first["verify"]["ok"], first
    src = repo_files(tmp_path)
    for f in src:
        assert (p.weights_dir / f.name).read_bytes() == f.read_bytes(), f.name
    assert first["fetched"] == sorted(f.name for f in src)
    assert first["hashed_while_fetched"] == len(first["fetched"]), "every fetched file is hashed as it is written"
    assert first["verify"]["hashed_files"] == 0, "and not read again"
    hub.clear_log()
    second = converge(p)
    assert not second["changed"] and second["verify"]["ok"] and second["fetched"] == []
    assert hub.log() == [], "a converged store asks the Hub nothing"
    assert second["verify"]["hashed_files"] == 0


@pytest.mark.parametrize("damage", ["delete", "truncate", "flip"])
def test_a_damaged_shard_is_named_and_fetched_again_alone(tmp_path: Path, hub: Any, damage: str) -> None:
    p = plan(tmp_path, hub)
    converge(p)
    shard = p.weights_dir / SHARD
    if damage == "delete":
        shard.unlink()
    elif damage == "truncate":
        os.truncate(shard, shard.stat().st_size // 2)
    else:
        with open(shard, "r+b") as handle:
            handle.seek(1000)
            byte = handle.read(1)
            handle.seek(1000)
            handle.write(bytes([byte[0] ^ 0xFF]))
    offline = fetch.offline(p, "hub")["verify"]
    assert not offline["ok"] and offline["bad_files"] == [SHARD]
    hub.clear_log()
    again = converge(p)
    assert again["changed"] and again["fetched"] == [SHARD] and again["verify"]["ok"], again
    assert bodies(hub) == [SHARD], "only that file came from the Hub"
    assert shard.read_bytes() == (tmp_path / "hub" / REPO / SHARD).read_bytes()


def test_a_cut_connection_mid_file_still_ends_whole(tmp_path: Path, hub: Any) -> None:
    """The connection dies 100 kB into a shard: the client tries again in the same run and the shard
    ends whole and verified. (huggingface_hub 1.28 downloads into a per-process temporary file that it
    removes on failure, file_download.py _download_to_tmp_and_move: a killed run starts the file over.)"""
    p = plan(tmp_path, hub)
    hub.faults({"cut": {"path": SHARD, "after": 100_000}})
    result = converge(p)
    assert result["verify"]["ok"] and SHARD in result["fetched"]
    gets = [e for e in hub.log() if e.get("file") == SHARD and e["method"] == "GET"]
    assert gets[0]["cut"] and gets[0]["bytes_sent"] == 100_000 and len(gets) == 2, gets
    assert (p.weights_dir / SHARD).read_bytes() == (tmp_path / "hub" / REPO / SHARD).read_bytes()


@pytest.fixture
def big_hub(tmp_path: Path):
    """Shards of many of http_get's write chunks (fetch.READ_CHUNK: http_get writes whole chunks), so
    that a kill can land with bytes on disk."""
    made = checkpoint.make(tmp_path / "hub" / REPO, shards=2, shard_bytes=12 << 20)
    with Hub(tmp_path / "hub") as running:
        running.commit = made["commit"]  # type: ignore[attr-defined]
        yield running


def test_a_fetch_killed_mid_file_resumes_where_it_stopped(tmp_path: Path, big_hub: Any, tool_lib: Path) -> None:
    """The command is SIGKILLed with a shard's first 10 MiB written (the Hub holds the rest back):
    the partial stays, named by the shard's sha256; the next run asks for the rest with a Range from
    exactly there, gets only the rest, and the shard ends whole and hashed as it came."""
    hub = big_hub
    shard = max(repo_files(tmp_path), key=lambda f: f.stat().st_size).name  # fetched first: largest first
    p = plan(tmp_path, hub, workers=1)
    data = {"source": "hub", **{k: str(v) if isinstance(v, Path) else v for k, v in vars(p).items()}}
    chunk = 10 * fetch.READ_CHUNK
    hub.faults({"stall": {"path": shard, "after": chunk + 4096}})
    proc = subprocess.Popen([sys.executable, "-s", "-m", "gpunode.stages.model", "converge"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(tool_lib)})
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"plan": data, "token": None}).encode())
    proc.stdin.close()
    size = (tmp_path / "hub" / REPO / shard).stat().st_size
    parts = p.weights_dir / fetch.PARTIAL
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(f.stat().st_size >= chunk for f in parts.glob("*.part")):
        assert proc.poll() is None, "the run ended before it was killed"
        time.sleep(0.02)
    proc.kill()
    proc.wait(timeout=10)
    hub.faults({"clear": True})  # the held answer ends; wait for its log entry, so that it is not the rerun's
    deadline = time.monotonic() + 10
    while not any(e.get("file") == shard and e["cut"] for e in hub.log()) and time.monotonic() < deadline:
        time.sleep(0.02)
    kept = list(parts.glob("*.part"))
    assert len(kept) == 1 and kept[0].stat().st_size == chunk, kept
    entry = next(e for e in fetch.manifests.load(p.manifest, REPO, hub.commit).files if e.path == shard)
    assert kept[0] == fetch.partial_path(p.weights_dir, entry)
    assert not (p.weights_dir / shard).exists(), "an unfinished file is never in place"
    hub.clear_log()
    result = converge(p)
    assert result["verify"]["ok"] and shard in result["fetched"], result
    gets = [e for e in hub.log() if e.get("file") == shard and e["method"] == "GET"]
    assert [(g["range"], g["status"], g["bytes_sent"]) for g in gets] == [(f"bytes={chunk}-", 206, size - chunk)]
    assert result["hashed_while_fetched"] == len(result["fetched"])
    assert (p.weights_dir / shard).read_bytes() == (tmp_path / "hub" / REPO / shard).read_bytes()
    assert not list(parts.glob("*.part")), "the partial became the file"


def test_a_file_is_written_in_small_chunks_and_handed_to_the_disk_as_it_comes(
        tmp_path: Path, big_hub: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """http_get hands over READ_CHUNK at a time (not its 10 MiB, copied outside the cache) while the fetch
    runs, and the library's own size again after; every WRITEBACK_EVERY bytes the kernel is told to write
    out what came and drop what is on the disk (posix_fadvise), each byte once, in order, never a wait."""
    from huggingface_hub import constants

    library_chunk = constants.DOWNLOAD_CHUNK_SIZE
    writes: list[int] = []
    advised: list[tuple[str, int, int, int]] = []
    real_write, real_fadvise = fetch._HashingWriter.write, os.posix_fadvise
    monkeypatch.setattr(fetch._HashingWriter, "WRITEBACK_EVERY", 2 << 20)
    monkeypatch.setattr(fetch._HashingWriter, "write", lambda self, data: writes.append(len(data)) or real_write(self, data))

    def fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        advised.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length, advice))
        real_fadvise(fd, offset, length, advice)

    monkeypatch.setattr(fetch.os, "posix_fadvise", fadvise)
    p = plan(tmp_path, big_hub, workers=1)
    result = converge(p)
    assert result["verify"]["ok"] and result["hashed_while_fetched"] == len(result["fetched"]), result
    assert constants.DOWNLOAD_CHUNK_SIZE == library_chunk
    assert max(writes) == fetch.READ_CHUNK and sum(writes) == result["fetched_bytes"]
    assert {advice for *_, advice in advised} == {os.POSIX_FADV_DONTNEED}
    shard = max(repo_files(tmp_path), key=lambda f: f.stat().st_size)
    ranges = [(offset, length) for name, offset, length, _ in advised if name.endswith(".part")
              and Path(name).name == fetch.partial_path(p.weights_dir, next(
                  e for e in fetch.manifests.load(p.manifest, REPO, big_hub.commit).files if e.path == shard.name)).name]
    window = 2 << 20
    # one call per window (the tail is left to the fsync): each window written out, then named again with
    # the next one, by when it is clean and dropped
    assert ranges == [(0, window)] + [((k - 1) * window, 2 * window) for k in range(1, shard.stat().st_size // window)]


def test_a_partial_of_the_wrong_bytes_is_caught_by_its_hash(tmp_path: Path, hub: Any) -> None:
    """A partial whose bytes are not the file's (a disk that lied, a hand that wrote there) is resumed,
    found wrong by the hash taken as it was written, dropped and named; the next run fetches it whole."""
    p = plan(tmp_path, hub)
    converge(p)
    shard = p.weights_dir / SHARD
    entry = next(e for e in fetch.manifests.load(p.manifest, REPO, hub.commit).files if e.path == SHARD)
    shard.unlink()
    part = fetch.partial_path(p.weights_dir, entry)
    part.write_bytes(b"\0" * 1000)
    with pytest.raises(fetch.HubRefused, match=f"{SHARD} came with hash .* not the revision's {entry.sha256}"):
        converge(p)
    assert not part.exists() and not shard.exists()
    again = converge(p)
    assert again["verify"]["ok"] and again["fetched"] == [SHARD]


@pytest.mark.parametrize("kept", ["whole", "too_long"])
def test_a_partial_whole_or_too_long_is_taken_or_started_over(tmp_path: Path, hub: Any, kept: str) -> None:
    """A partial with every byte (killed between its last write and the move) is moved into place with
    no body fetched; one longer than the file can be is started over from byte 0."""
    p = plan(tmp_path, hub)
    converge(p)
    shard = p.weights_dir / SHARD
    entry = next(e for e in fetch.manifests.load(p.manifest, REPO, hub.commit).files if e.path == SHARD)
    data = shard.read_bytes()
    shard.unlink()
    fetch.partial_path(p.weights_dir, entry).write_bytes(data if kept == "whole" else data + b"extra")
    hub.clear_log()
    again = converge(p)
    assert again["verify"]["ok"] and again["fetched"] == [SHARD] and shard.read_bytes() == data
    gets = [(e["range"], e["bytes_sent"]) for e in hub.log() if e.get("file") == SHARD and e["method"] == "GET"]
    assert gets == ([] if kept == "whole" else [(None, len(data))]), gets


def test_stale_partials_are_dropped_before_a_fetch(tmp_path: Path, hub: Any) -> None:
    """huggingface_hub's per-process .incomplete of a killed run and a partial of no file of the
    revision can never be resumed: they are removed, not left to fill the store."""
    p = plan(tmp_path, hub)
    converge(p)
    stale_hf = p.weights_dir / fetch.HF_META / f"{SHARD}.0123abcd.incomplete"
    stale_ours = p.weights_dir / fetch.PARTIAL / f"{'0' * 64}.part"
    for stale in (stale_hf, stale_ours):
        stale.parent.mkdir(parents=True, exist_ok=True)
        stale.write_bytes(b"x" * 10)
    (p.weights_dir / SHARD).unlink()
    assert converge(p)["fetched"] == [SHARD]
    assert not stale_hf.exists() and not stale_ours.exists()


def test_a_file_the_endpoint_offers_through_xet_goes_to_hf_xet(tmp_path: Path, hub: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the HEAD carries Xet data (utils/_xet.py parse_xet_file_data_from_response), the file goes
    through hf_hub_download (and so hf_xet) and is hashed by the verify after it; the rest stay on HTTP."""
    import huggingface_hub
    from huggingface_hub import file_download
    from huggingface_hub.utils import XetFileData

    real_meta, real_download = file_download.get_hf_file_metadata, huggingface_hub.hf_hub_download
    xet: list[str] = []

    def meta(url: str, **kw: Any) -> Any:
        got = real_meta(url, **kw)
        return replace(got, xet_file_data=XetFileData("0" * 64, "http://127.0.0.1:9/xet")) if SHARD in url else got

    def download(repo: str, filename: str, **kw: Any) -> str:
        xet.append(filename)
        monkeypatch.setattr(file_download, "get_hf_file_metadata", real_meta)  # the library's own path from here
        return real_download(repo, filename, **kw)
    monkeypatch.setattr(file_download, "get_hf_file_metadata", meta)
    monkeypatch.setattr(file_download, "is_xet_available", lambda: True)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    result = converge(plan(tmp_path, hub, workers=1))
    assert xet == [SHARD] and result["verify"]["ok"], result
    assert result["hashed_while_fetched"] == len(result["fetched"]) - 1 and result["verify"]["hashed_files"] == 1


def test_progress_lines_say_bytes_rate_and_eta(tmp_path: Path, hub: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "PROGRESS_EVERY_S", 0.01)
    real = fetch.download

    def slow(*args: Any) -> Any:
        time.sleep(0.1)
        return real(*args)
    monkeypatch.setattr(fetch, "download", slow)
    lines: list[dict[str, Any]] = []
    converge(plan(tmp_path, hub), lines=lines)
    progress = [line["progress"] for line in lines if "progress" in line]
    assert progress and {"bytes", "total", "rate", "eta_s"} <= set(progress[-1])
    assert lines[0]["fetching"]["files"] == len(repo_files(tmp_path))


def test_an_unreachable_hub_fails_fast(tmp_path: Path, hub: Any) -> None:
    from fakes.ports import closed_port

    start = time.monotonic()
    with closed_port() as port, pytest.raises(fetch.HubUnreachable):
        converge(plan(tmp_path, hub, endpoint=f"http://127.0.0.1:{port}"))
    assert time.monotonic() - start < 15


def test_an_unknown_revision_is_named(tmp_path: Path, hub: Any) -> None:
    with pytest.raises(fetch.HubRefused, match="revision not found"):
        converge(plan(tmp_path, hub, revision="0" * 40))


@pytest.mark.parametrize("oid", ["../../../../tmp/owned", "Z" * 64])
def test_a_listing_with_a_hash_that_is_no_hash_is_refused_and_writes_nothing(
        tmp_path: Path, hub: Any, monkeypatch: pytest.MonkeyPatch, oid: str) -> None:
    # A mirror's LFS oid names the partial on disk: "../x" would write outside the store.
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    real = HfApi.list_repo_tree

    def hostile(self: Any, *args: Any, **kwargs: Any) -> Any:
        for item in real(self, *args, **kwargs):
            if isinstance(item, RepoFile) and item.lfs:
                item.lfs.sha256 = oid  # type: ignore[misc]
            yield item

    monkeypatch.setattr(HfApi, "list_repo_tree", hostile)
    p = plan(tmp_path, hub)
    with pytest.raises(fetch.HubRefused, match="listing of .*hex digits"):
        converge(p)
    written = sorted(str(f.relative_to(tmp_path)) for f in (tmp_path / "store").rglob("*") if not f.is_dir())
    assert written == [str(p.manifest.with_suffix(".lock").relative_to(tmp_path))], "only the revision's lock"
    assert bodies(hub) == []


def test_a_refused_token_is_named_and_never_shown(tmp_path: Path, hub: Any) -> None:
    hub.faults({"token": "hf_right_one"})
    with pytest.raises(fetch.HubRefused) as caught:
        converge(plan(tmp_path, hub), token="hf_wrong_secret_value")
    assert "token" in str(caught.value) and "hf_wrong_secret_value" not in str(caught.value)
    assert converge(plan(tmp_path, hub), token="hf_right_one")["verify"]["ok"]


def test_a_store_too_small_is_refused_before_the_first_byte(tmp_path: Path, hub: Any,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch.shutil, "disk_usage", lambda _path: type("U", (), {"free": 1000})())
    with pytest.raises(fetch.StoreTooSmall) as caught:
        converge(plan(tmp_path, hub))
    assert "1000 bytes" in str(caught.value) and "more" in str(caught.value)
    assert bodies(hub) == [], "refused before the first byte"


@pytest.fixture
def tool_lib(tmp_path: Path) -> Path:
    """gpunode's files as the role ships them to the machine with the weights (derive.modelplan.TOOL_FILES),
    and nothing else of gpunode: the command must run from them alone."""
    from gpunode.derive.modelplan import PACKAGE, TOOL_FILES

    lib = tmp_path / "lib"
    for rel in TOOL_FILES:
        (lib / rel).parent.mkdir(parents=True, exist_ok=True)
        (lib / rel).write_bytes((PACKAGE.parent / rel).read_bytes())
    return lib


def tool(lib: Path, verb: str, request: dict[str, Any]) -> tuple[int, list[dict[str, Any]], str]:
    proc = subprocess.run([sys.executable, "-s", "-m", "gpunode.stages.model", verb], input=json.dumps(request),
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(lib)})
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()], proc.stdout + proc.stderr


def test_the_command_speaks_json_lines_and_gpunodes_exit_codes(tmp_path: Path, hub: Any, tool_lib: Path) -> None:
    p = plan(tmp_path, hub)
    data = {"source": "hub", **{k: str(v) if isinstance(v, Path) else v for k, v in vars(p).items()}}
    code, lines, out = tool(tool_lib, "converge", {"plan": data, "token": None})
    assert code == 0 and lines[-1]["result"]["verify"]["ok"], out
    assert f"{tool_lib}/gpunode/stages/model" in subprocess.run(
        [sys.executable, "-s", "-c", "import gpunode.stages.model.fetch as f; print(f.__file__)"], capture_output=True,
        text=True, env={**os.environ, "PYTHONPATH": str(tool_lib)}).stdout, "the shipped files are the ones run"
    code, lines, _ = tool(tool_lib, "verify", {"plan": data})
    assert code == 0 and lines[-1]["result"]["verify"]["files"] == len(repo_files(tmp_path))
    (p.weights_dir / SHARD).unlink()
    code, lines, _ = tool(tool_lib, "verify", {"plan": data})
    assert code == 1 and lines[-1]["result"]["verify"]["bad_files"] == [SHARD]
    code, lines, out = tool(tool_lib, "converge", {"plan": {**data, "endpoint": "http://127.0.0.1:9"}, "token": "hf_never_shown"})
    assert code == 3 and lines[-1]["kind"] == "unreachable" and "hf_never_shown" not in out
    code, lines, _ = tool(tool_lib, "converge", {"plan": "nope"})
    assert code == 2 and lines[-1]["kind"] == "usage"
