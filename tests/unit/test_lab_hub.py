"""The lab's Hugging Face Hub stand-in (gpunode_lab.hub) against the REAL huggingface_hub 1.28.0 client, on
the loopback, in-process: snapshot_download (pinned and by branch, dry run, resume after a cut, a lost
file), hf_hub_download, HfApi.model_info / list_repo_tree / get_paths_info, and the client's own errors for
an unknown revision, repo, file, a missing or wrong token and a dead port. Also the tiny GLM-5-NVFP4-like
checkpoint (gpunode_lab.checkpoint), read back with the real safetensors library.

No real network, no user cache, no user token: every call gets ``endpoint=hub.url``, ``token=False`` (or
the hub's test token) and folders under tmp_path; HF_HOME and the token variables are pointed away too."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import safetensors
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import close_session
from safetensors import safe_open

from gpunode_lab import checkpoint, hub as hubmod
from gpunode_lab.hub import Hub, commit_of

REPO = "zai-lab/GLM-5-NVFP4-tiny"
BIG = "zai-lab/GLM-5-NVFP4-big"          # one shard over the client's 10 MiB read chunk: resume needs it
CHUNK = constants.DOWNLOAD_CHUNK_SIZE    # http_get writes (and so resumes from) whole chunks of this
SECRET = "hf_labtoken_do_not_print_0123456789"
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the loopback, never a proxy


@pytest.fixture(autouse=True)
def no_user_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_OIDC_RESOURCE", "HTTP_PROXY", "HTTPS_PROXY",
                 "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost,::1")
    # constants are read at import time: pin the ones that could reach a user's setup
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf_home" / "token"))
    close_session()      # the client's shared httpx.Client is made again, under this environment
    yield
    close_session()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("hubroot")
    checkpoint.make(base / REPO, shards=3)
    (base / REPO / "docs" / "notes").mkdir(parents=True)
    (base / REPO / "docs" / "notes" / "README.txt").write_text("a nested file\n")
    checkpoint.make(base / BIG, shards=1, shard_bytes=CHUNK + 1024 * 1024, seed=1)
    return base


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[Hub]:
    with Hub(root, page_size=2) as hub:
        yield hub


@pytest.fixture
def hub(server: Hub) -> Hub:
    server.faults({"clear": True, "token": None})
    server.clear_log()
    return server


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".hub") and ".cache" not in p.parts}


def bodies(hub: Hub) -> list[dict[str, Any]]:
    """The log's GETs that sent file bytes."""
    return [e for e in hub.log() if e["method"] == "GET" and e["file"] and e["bytes_sent"] > 0]


def lab(hub: Hub, method: str, path: str, data: Any = None) -> Any:
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(hub.url + path, data=body, method=method,
                                 headers={"Content-Type": "application/json"})
    with DIRECT.open(req, timeout=10) as resp:
        return json.loads(resp.read())


# ----------------------------------------------------------------------------- the checkpoint
def test_commit_of_is_deterministic_and_only_content_counts(tmp_path: Path) -> None:
    a, b = checkpoint.make(tmp_path / "a"), checkpoint.make(tmp_path / "b")
    assert a["commit"] == b["commit"] == commit_of(tmp_path / "a") and len(a["commit"]) == 40
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b")
    os.utime(tmp_path / "a" / "config.json", ns=(1, 1))                 # times do not count
    (tmp_path / "a" / ".hub-extra").mkdir()                              # nor .hub* names
    (tmp_path / "a" / ".hub-extra" / "x").write_text("not content")
    assert commit_of(tmp_path / "a") == a["commit"]
    assert (tmp_path / "a" / hubmod.HASH_CACHE).is_file()                # the hashes are kept beside
    (tmp_path / "a" / "tokenizer.json").write_text('{"changed": 1}\n')
    assert commit_of(tmp_path / "a") != a["commit"]
    assert checkpoint.make(tmp_path / "c", seed=1)["commit"] != a["commit"]


def test_checkpoint_is_real_safetensors_matching_its_index(tmp_path: Path) -> None:
    made = checkpoint.make(tmp_path / "ck", shards=3, shard_bytes=64 * 1024)
    folder = tmp_path / "ck"
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert (folder / "model.safetensors.index.json").read_text() == json.dumps(index, indent=2, sort_keys=True) + "\n"
    assert made["shards"] == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert sorted(set(index["weight_map"].values())) == made["shards"]
    total = 0
    for shard in made["shards"]:
        with safe_open(folder / shard, framework="numpy") as f:
            keys = set(f.keys())
            assert f.metadata() == {"format": "pt"}
            packed = next(k for k in keys if ".experts." in k and k.endswith(".weight"))
            assert f.get_tensor(packed).dtype.name == "uint8"       # numpy reads all but the F8 scales
        assert keys == {k for k, v in index["weight_map"].items() if v == shard}
        parsed = dict(safetensors.deserialize((folder / shard).read_bytes()))
        assert set(parsed) == keys
        total += sum(len(t["data"]) for t in parsed.values())
        assert {t["dtype"] for t in parsed.values()} == {"BF16", "U8", "F8_E4M3", "F32"}
        assert 0.7 * 64 * 1024 < (folder / shard).stat().st_size < 1.1 * 64 * 1024
    assert index["metadata"]["total_size"] == total
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["GlmMoeDsaForCausalLM"] and config["model_type"] == "glm_moe_dsa"
    assert config["quantization_config"]["quant_method"] == "modelopt"
    assert config["quantization_config"]["quant_algo"] == "NVFP4"
    assert config["num_hidden_layers"] == 3
    assert json.loads((folder / "tokenizer.json").read_text()) == {}
    assert set(made["files"]) == set(files_of(folder))


# ----------------------------------------------------------------------------- downloads
def test_snapshot_of_the_pinned_commit_is_byte_identical_and_paged(hub: Hub, root: Path, tmp_path: Path) -> None:
    commit = commit_of(root / REPO)
    out = snapshot_download(REPO, revision=commit, local_dir=tmp_path / "out", cache_dir=tmp_path / "cache",
                            endpoint=hub.url, token=False)
    assert Path(out) == (tmp_path / "out").resolve()
    assert files_of(tmp_path / "out") == files_of(root / REPO)
    log = hub.log()
    # a pinned commit needs no model_info (_snapshot_download.py:260-261): the listing, then HEAD + GET each
    assert not [e for e in log if e["path"].startswith(f"/api/models/{REPO}?") or e["path"] == f"/api/models/{REPO}"]
    pages = [e for e in log if "/tree/" in e["path"]]
    assert len(pages) == -(-(len(files_of(root / REPO)) + 2) // 2) and all(e["status"] == 200 for e in pages)
    assert "cursor=" in pages[-1]["path"]
    got = sorted(e["file"] for e in bodies(hub))
    assert got == sorted(files_of(root / REPO))
    lfs = [e for e in log if e["method"] == "HEAD" and e["status"] == 302]
    assert sorted(e["file"] for e in lfs) == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]


def test_a_second_download_fetches_no_file_body(hub: Hub, root: Path, tmp_path: Path) -> None:
    commit = commit_of(root / REPO)
    common = dict(cache_dir=tmp_path / "cache", endpoint=hub.url, token=False)
    snapshot_download(REPO, revision=commit, local_dir=tmp_path / "out", **common)
    hub.clear_log()
    snapshot_download(REPO, revision=commit, local_dir=tmp_path / "out", **common)
    assert hub.log() == []                                   # pinned: the tree and metadata on disk suffice
    snapshot_download(REPO, local_dir=tmp_path / "out", **common)
    assert [(e["method"], e["path"]) for e in hub.log()] == [("GET", f"/api/models/{REPO}/revision/main")]
    snapshot_download(REPO, revision=commit, **common)       # now the shared cache, bodies once more
    hub.clear_log()
    snapshot_download(REPO, local_dir=tmp_path / "out2", **common)   # a new folder: HEADs, copies, no body
    assert bodies(hub) == [] and {e["method"] for e in hub.log()} == {"GET", "HEAD"}
    assert files_of(tmp_path / "out") == files_of(tmp_path / "out2") == files_of(root / REPO)


def test_dry_run_lists_every_file_with_its_size_and_what_would_download(hub: Hub, root: Path, tmp_path: Path) -> None:
    kw = dict(local_dir=tmp_path / "out", cache_dir=tmp_path / "cache", endpoint=hub.url, token=False)
    want = {p: len(b) for p, b in files_of(root / REPO).items()}
    plan = snapshot_download(REPO, dry_run=True, **kw)
    assert {i.filename: i.file_size for i in plan} == want
    assert all(i.will_download and not i.is_cached and i.commit_hash == commit_of(root / REPO) for i in plan)
    assert bodies(hub) == [] and not (tmp_path / "out" / "config.json").exists()
    snapshot_download(REPO, **kw)
    (tmp_path / "out" / "config.json").unlink()
    again = {i.filename: i.will_download for i in snapshot_download(REPO, dry_run=True, **kw)}
    assert again == {p: p == "config.json" for p in want}


def test_list_repo_tree_pages_through_every_file_with_size_and_lfs_sha256(hub: Hub, root: Path) -> None:
    api = HfApi(endpoint=hub.url, token=False)
    items = list(api.list_repo_tree(REPO, recursive=True, expand=True))
    files = {i.path: i for i in items if i.__class__.__name__ == "RepoFile"}
    folders = {i.path for i in items if i.__class__.__name__ == "RepoFolder"}
    local = files_of(root / REPO)
    assert set(files) == set(local) and folders == {"docs", "docs/notes"}
    for path, item in files.items():
        assert item.size == len(local[path])
        assert item.last_commit.oid == commit_of(root / REPO) and item.security.safe
        if path.endswith(".safetensors"):
            assert item.lfs.sha256 == hashlib.sha256(local[path]).hexdigest() and item.lfs.size == item.size
            pointer = hubmod.lfs_pointer(item.lfs.sha256, item.size)
            assert item.blob_id == hubmod.git_blob_sha1(pointer) and item.lfs.pointer_size == len(pointer)
        else:
            assert item.lfs is None and item.blob_id == hubmod.git_blob_sha1(local[path])
    assert len([e for e in hub.log() if "/tree/" in e["path"]]) == -(-len(items) // 2) >= 5
    top = list(api.list_repo_tree(REPO, path_in_repo="docs"))
    assert [(i.path, i.__class__.__name__) for i in top] == [("docs/notes", "RepoFolder")]


def test_model_info_and_paths_info(hub: Hub, root: Path) -> None:
    api = HfApi(endpoint=hub.url, token=False)
    commit = commit_of(root / REPO)
    info = api.model_info(REPO, files_metadata=True)
    assert info.id == REPO and info.sha == commit and info.config["architectures"] == ["GlmMoeDsaForCausalLM"]
    sizes = {s.rfilename: (s.size, s.lfs.sha256 if s.lfs else None) for s in info.siblings}
    local = files_of(root / REPO)
    assert sizes == {p: (len(b), hashlib.sha256(b).hexdigest() if p.endswith(".safetensors") else None)
                     for p, b in local.items()}
    assert info.safetensors.total > 0 and set(info.safetensors.parameters) == {"BF16", "U8", "F8_E4M3", "F32"}
    slim = api.model_info(REPO, revision=commit, expand=["sha"])
    assert slim.sha == commit and slim.siblings is None
    got = api.get_paths_info(REPO, ["config.json", "docs", "missing.bin"], revision=commit)
    assert [(i.path, type(i).__name__) for i in got] == [("config.json", "RepoFile"), ("docs", "RepoFolder")]


def test_a_cut_connection_resumes_with_a_range_and_ends_byte_identical(hub: Hub, root: Path, tmp_path: Path) -> None:
    shard = "model-00001-of-00001.safetensors"
    size = (root / BIG / shard).stat().st_size
    after = CHUNK + 512 * 1024
    assert size > after
    state = lab(hub, "POST", "/_lab/faults", {"cut": {"path": shard, "after": after}})
    assert state["cuts"] == [{"path": shard, "after": after}]
    snapshot_download(BIG, local_dir=tmp_path / "out", cache_dir=tmp_path / "cache", endpoint=hub.url, token=False)
    assert files_of(tmp_path / "out") == files_of(root / BIG)
    gets = [e for e in lab(hub, "GET", "/_lab/log") if e["file"] == shard and e["method"] == "GET"]
    assert [(e["status"], e["range"], e["bytes_sent"], e["cut"]) for e in gets] == [
        (200, None, after, True),                                   # cut after `after` bytes
        (206, f"bytes={CHUNK}-", size - CHUNK, False),              # resumed from the last whole chunk
    ]
    assert lab(hub, "GET", "/_lab/faults")["cuts"] == []            # once
    assert lab(hub, "DELETE", "/_lab/log") == {"cleared": True} and hub.log() == []


def test_a_deleted_file_is_fetched_again_alone(hub: Hub, root: Path, tmp_path: Path) -> None:
    commit = commit_of(root / REPO)
    kw = dict(revision=commit, local_dir=tmp_path / "out", cache_dir=tmp_path / "cache", endpoint=hub.url,
              token=False)
    snapshot_download(REPO, **kw)
    (tmp_path / "out" / "model-00002-of-00003.safetensors").unlink()
    hub.clear_log()
    snapshot_download(REPO, **kw)
    assert [e["file"] for e in bodies(hub)] == ["model-00002-of-00003.safetensors"]
    assert {e["file"] for e in hub.log()} == {"model-00002-of-00003.safetensors"}
    assert files_of(tmp_path / "out") == files_of(root / REPO)


def test_hf_hub_download_of_one_file_into_the_cache(hub: Hub, root: Path, tmp_path: Path) -> None:
    path = hf_hub_download(REPO, "docs/notes/README.txt", cache_dir=tmp_path / "cache", endpoint=hub.url,
                           token=False)
    assert Path(path).read_bytes() == (root / REPO / "docs" / "notes" / "README.txt").read_bytes()
    assert f"snapshots/{commit_of(root / REPO)}/docs/notes/README.txt" in Path(path).as_posix()
    blob = Path(path).resolve()
    assert blob.name == hubmod.git_blob_sha1(blob.read_bytes())     # the cache names blobs by ETag


def test_hf_endpoint_in_the_environment_is_enough(hub: Hub, root: Path, tmp_path: Path) -> None:
    """HF_ENDPOINT is read when huggingface_hub is imported (constants.py:69-70): a fresh process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "home"), HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_IMPLICIT_TOKEN="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    code = ("import sys; from huggingface_hub import snapshot_download; "
            f"print(snapshot_download({REPO!r}, local_dir=sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert files_of(tmp_path / "out") == files_of(root / REPO)
    assert all(e["path"].startswith(("/api/models/", f"/{REPO}/resolve/", "/_lfs/")) for e in hub.log())


# ----------------------------------------------------------------------------- errors
def test_an_unknown_revision_is_revision_not_found(hub: Hub, tmp_path: Path) -> None:
    kw = dict(local_dir=tmp_path / "out", cache_dir=tmp_path / "cache", endpoint=hub.url, token=False)
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(REPO, revision="f" * 40, **kw)            # via the tree listing
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(REPO, revision="v9", **kw)                # via model_info
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="v9", cache_dir=tmp_path / "c2", endpoint=hub.url,
                        token=False)
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(REPO, "nope.bin", cache_dir=tmp_path / "c2", endpoint=hub.url, token=False)
    assert {(e["status"]) for e in hub.log()} == {404}


def test_an_unknown_repo_is_repository_not_found(hub: Hub, tmp_path: Path) -> None:
    kw = dict(local_dir=tmp_path / "out", cache_dir=tmp_path / "cache", endpoint=hub.url, token=False)
    for revision in (None, "a" * 40):
        with pytest.raises(RepositoryNotFoundError) as caught:
            snapshot_download("zai-lab/no-such-model", revision=revision, **kw)
        assert not isinstance(caught.value, GatedRepoError) and caught.value.response.status_code == 401
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub.url, token=False).model_info("zai-lab/GLM-5-NVFP4")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("zai-lab/no-such-model", "config.json", cache_dir=tmp_path / "c", endpoint=hub.url,
                        token=False)


def test_a_missing_or_wrong_token_gets_the_clients_error_and_never_shows_the_token(
        hub: Hub, root: Path, tmp_path: Path) -> None:
    assert lab(hub, "POST", "/_lab/faults", {"token": SECRET}) == {"cuts": [], "stalls": [], "token": True}
    cache = tmp_path / "cache"
    with pytest.raises(GatedRepoError) as missing:
        snapshot_download(REPO, local_dir=tmp_path / "a", cache_dir=cache, endpoint=hub.url, token=False)
    with pytest.raises(GatedRepoError):
        hf_hub_download(REPO, "config.json", cache_dir=cache, endpoint=hub.url, token=False)
    wrong = "hf_wrong_" + SECRET[::-1]
    errors = [missing.value]
    for call in (lambda: snapshot_download(REPO, local_dir=tmp_path / "b", cache_dir=cache, endpoint=hub.url,
                                           token=wrong),
                 lambda: snapshot_download(REPO, revision=commit_of(root / REPO), local_dir=tmp_path / "b",
                                           cache_dir=cache, endpoint=hub.url, token=wrong),
                 lambda: HfApi(endpoint=hub.url, token=wrong).model_info(REPO)):
        with pytest.raises(HfHubHTTPError) as caught:
            call()
        assert caught.value.response.status_code == 401 and not isinstance(caught.value, RepositoryNotFoundError)
        assert "Invalid credentials in Authorization header" in str(caught.value)
        errors.append(caught.value)
    for err in errors:
        assert SECRET not in f"{err} {err!r} {err.server_message}" and wrong not in str(err)
    assert {e["status"] for e in hub.log()} == {401}
    out = snapshot_download(REPO, local_dir=tmp_path / "ok", cache_dir=cache, endpoint=hub.url, token=SECRET)
    assert files_of(Path(out)) == files_of(root / REPO)
    lab(hub, "POST", "/_lab/faults", {"token": None})
    assert HfApi(endpoint=hub.url, token=False).model_info(REPO).id == REPO


def test_a_port_nobody_listens_on_fails_fast_with_the_connection_error(tmp_path: Path) -> None:
    from fakes.ports import closed_port

    with closed_port() as port:
        dead = f"http://127.0.0.1:{port}"
    kw = dict(cache_dir=tmp_path / "cache", endpoint=dead, token=False, etag_timeout=2)
    started = time.monotonic()
    with pytest.raises(LocalEntryNotFoundError) as by_branch:       # model_info's ConnectError, wrapped
        snapshot_download(REPO, local_dir=tmp_path / "out", **kw)
    assert isinstance(by_branch.value.__cause__, httpx.ConnectError)
    with pytest.raises(httpx.ConnectError):                          # the tree listing's, as is
        snapshot_download(REPO, revision="b" * 40, local_dir=tmp_path / "out", **kw)
    assert time.monotonic() - started < 15


# ----------------------------------------------------------------------------- the server itself
def test_ranges_and_errors_on_the_wire(hub: Hub, root: Path) -> None:
    commit = commit_of(root / REPO)
    data = (root / REPO / "model.safetensors.index.json").read_bytes()
    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=10)
    url = f"/{REPO}/resolve/{commit}/model.safetensors.index.json"
    answers = []
    for rng in ("bytes=10-19", "bytes=-7", f"bytes={len(data)}-", "bytes=0-1,5-6"):
        conn.request("GET", url, headers={"Range": rng})
        resp = conn.getresponse()                                   # one kept-alive connection throughout
        answers.append((resp.status, resp.getheader("Content-Range"), resp.read()))
    assert answers == [(206, f"bytes 10-19/{len(data)}", data[10:20]),
                       (206, f"bytes {len(data) - 7}-{len(data) - 1}/{len(data)}", data[-7:]),
                       (416, f"bytes */{len(data)}", b'{"error": "Requested Range Not Satisfiable"}'),
                       (200, None, data)]
    conn.request("HEAD", f"/{REPO}/resolve/main/model-00001-of-00003.safetensors")
    resp = conn.getresponse()
    resp.read()
    shard = "model-00001-of-00003.safetensors"
    sha = hashlib.sha256((root / REPO / shard).read_bytes()).hexdigest()
    head = [resp.status, *(resp.getheader(h) for h in ("Location", "X-Linked-Etag", "X-Linked-Size", "X-Repo-Commit"))]
    assert head == [302, f"{hub.url}/_lfs/{sha}", f'"{sha}"', str(os.path.getsize(root / REPO / shard)), commit]
    conn.request("HEAD", f"/{REPO}/resolve/main/missing.txt")
    resp = conn.getresponse()
    resp.read()
    assert (resp.status, resp.getheader("X-Error-Code"), resp.getheader("X-Repo-Commit")) == (
        404, "EntryNotFound", commit)
    for path in ("/api/models/%2E%2E/zai-lab", f"/api/datasets/{REPO}", "/nowhere"):
        conn.request("GET", path)
        resp = conn.getresponse()
        assert (resp.status, resp.getheader("X-Error-Code"), json.loads(resp.read())["error"]) in (
            (401, "RepoNotFound", "Repository not found"),
            (404, None, "Sorry, we can't find the page you are looking for."))
    conn.close()


def test_the_cli_runs_on_a_bare_python_and_refuses_a_non_loopback_host(root: Path, tmp_path: Path) -> None:
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    script = tmp_path / "hub.py"
    shutil.copy(hubmod.__file__, script)                             # alone, as it goes into the container
    refused = subprocess.run([python, "-I", "-S", str(script), "--root", str(root), "--port", "0",
                              "--host", "0.0.0.0"], capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2 and "loopback" in refused.stderr
    token = tmp_path / "token"
    token.write_text(SECRET + "\n")
    proc = subprocess.Popen([python, "-I", "-S", str(script), "--root", str(root), "--port", "0",
                             "--token-file", str(token), "--page-size", "1000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = json.loads(proc.stdout.readline())
        assert ready["repos"][REPO] == commit_of(root / REPO)
        req = urllib.request.Request(f"{ready['url']}/api/models/{REPO}/tree/main",
                                     headers={"Authorization": f"Bearer {SECRET}"})
        with DIRECT.open(req, timeout=10) as resp:
            top = {item["path"] for item in json.loads(resp.read())}
        assert resp.headers.get("Link") is None                     # 1000 a page: one page
        assert top == {p for p in files_of(root / REPO) if "/" not in p} | {"docs"}
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
