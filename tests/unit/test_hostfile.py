"""The host file: valid examples load; each malformed one gets its own one-line message and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode import hostfile

ROOT = Path(__file__).resolve().parents[2]

# A valid file whose line numbers the cases below rely on (line 1 is "version: 1").
BASE = """\
version: 1
hosts:
  - name: pve1
    ssh:
      address: 192.0.2.10
    api:
      url: https://192.0.2.10:8006
      node: pve1
      auth:
        method: password
        password: {env: PVE_PASS}
    driver:
      version: "580.95.05"
    container:
      vmid: 200
      hostname: glm5
      template: local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst
      storage: local-lvm
      disk_gb: 100
      cores: 32
      memory_gb: 256
      network:
        ip: 192.0.2.20/24
        gateway: 192.0.2.1
      gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    model:
      id: lukealonso/GLM-5-NVFP4
      path: /models/glm5
"""


def mutate(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, 1)


# (id, file text, expected line of stderr after "error: <file>: ")
CASES: list[tuple[str, str, str]] = [
    ("memory-zero", mutate("memory_gb: 256", "memory_gb: 0"),
     "hosts[0].container.memory_gb: must be > 0 (line 21)"),
    ("cores-negative", mutate("cores: 32", "cores: -4"),
     "hosts[0].container.cores: must be > 0 (line 20)"),
    ("disk-text", mutate("disk_gb: 100", "disk_gb: lots"),
     "hosts[0].container.disk_gb: must be a whole number (line 19)"),
    ("typo-key", mutate("cores: 32", "cores: 32\n      coers: 8"),
     "hosts[0].container.coers: unknown key (did you mean 'cores'?) (line 21)"),
    ("unknown-top", mutate("version: 1", "version: 1\nhostz: []"),
     "hostz: unknown key (did you mean 'hosts'?) (line 2)"),
    ("version-2", mutate("version: 1", "version: 2"),
     "version: must be 1 (line 1)"),
    ("no-hosts", "version: 1\nhosts: []\n",
     "hosts: needs at least 1 item(s) (line 2)"),
    ("missing-model", BASE.split("    model:")[0],
     "hosts[0].model: required key is missing (line 3)"),
    ("inline-password", mutate("password: {env: PVE_PASS}", "password: hunter2"),
     "hosts[0].api.auth.password: secrets are never inline: give {env: NAME}, {file: PATH} or {vault: PATH} (line 11)"),
    ("secret-two-sources", mutate("password: {env: PVE_PASS}", "password: {env: PVE_PASS, file: /x}"),
     "hosts[0].api.auth.password: give exactly one of env, file or vault (line 11)"),
    ("secret-bad-env-name", mutate("password: {env: PVE_PASS}", "password: {env: 9PASS}"),
     "hosts[0].api.auth.password.env: has the wrong form"),
    ("password-method-no-password", mutate("        password: {env: PVE_PASS}\n", ""),
     "hosts[0].api.auth: method password needs a password"),
    ("token-no-secret", mutate("method: password\n        password: {env: PVE_PASS}", "method: token\n        token_id: gpunode"),
     "hosts[0].api.auth: method token needs token_id and token_secret (line 9)"),
    ("auth-method-bad", mutate("method: password", "method: kerberos"),
     "hosts[0].api.auth.method: must be 'password', 'token' or 'local' (line 10)"),
    ("url-http", mutate("url: https://192.0.2.10:8006", "url: http://192.0.2.10:8006"),
     "hosts[0].api.url: has the wrong form"),
    ("driver-old", mutate('version: "580.95.05"', 'version: "550.54.15"'),
     "hosts[0].driver.version: 550.54.15 is older than 570: Blackwell (SM120) needs >= 570 (line 13)"),
    ("driver-proprietary", mutate('version: "580.95.05"', 'version: "580.95.05"\n      open_module: false'),
     "hosts[0].driver.open_module: Blackwell GPUs need NVIDIA's open kernel module: set true (line 14)"),
    ("vmid-low", mutate("vmid: 200", "vmid: 42"),
     "hosts[0].container.vmid: must be >= 100 (line 15)"),
    ("hostname-underscore", mutate("hostname: glm5", "hostname: glm_5"),
     "hosts[0].container.hostname: has the wrong form"),
    ("template-not-vztmpl", mutate("template: local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst", "template: debian-12.tar.zst"),
     "hosts[0].container.template: has the wrong form"),
    ("ip-no-prefix", mutate("ip: 192.0.2.20/24", "ip: 192.0.2.20"),
     "hosts[0].container.network.ip: '192.0.2.20' needs a prefix length, e.g. 192.0.2.20/24 (line 23)"),
    ("ip-garbage", mutate("ip: 192.0.2.20/24", "ip: banana"),
     "hosts[0].container.network.ip: 'banana' is not 'dhcp' or an address with prefix"),
    ("gateway-outside", mutate("gateway: 192.0.2.1", "gateway: 198.51.100.1"),
     "hosts[0].container.network: gateway 198.51.100.1 is outside 192.0.2.0/24 (line 22)"),
    ("dhcp-no-ssh", mutate("ip: 192.0.2.20/24\n        gateway: 192.0.2.1", "ip: dhcp"),
     "hosts[0]: container.network.ip is dhcp: give container.ssh.address so the node can be reached (line 3)"),
    ("gpus-duplicate", mutate("gpus: [0, 1, 2, 3, 4, 5, 6, 7]", "gpus: [0, 1, 1]"),
     "hosts[0].container.gpus: lists a GPU twice (line 25)"),
    ("gpus-empty", mutate("gpus: [0, 1, 2, 3, 4, 5, 6, 7]", "gpus: []"),
     "hosts[0].container.gpus: select at least one GPU, or 'all' (line 25)"),
    ("gpus-fewer-than-tp", mutate("gpus: [0, 1, 2, 3, 4, 5, 6, 7]", "gpus: [0, 1, 2, 3]"),
     # At container.gpus now (the TP size is the profile's), and equal, not only enough: the
     # server is given every GPU selected (tests/unit/test_hostfile_rules.py has the rest).
     "hosts[0].container.gpus: server --tp-size 8 (profile glm5-nvfp4-sm120) needs 8 GPUs but container.gpus "
     "selects 4: make them equal (the server is given every GPU selected) (line 25)"),
    ("gpus-word", mutate("gpus: [0, 1, 2, 3, 4, 5, 6, 7]", "gpus: some"),
     "hosts[0].container.gpus: must be 'all' (line 25)"),
    ("model-relative", mutate("path: /models/glm5", "path: models/glm5"),
     "hosts[0].model.path: models/glm5 must be an absolute path on the node (line 28)"),
    ("model-id-bad", mutate("id: lukealonso/GLM-5-NVFP4", "id: GLM-5"),
     "hosts[0].model.id: has the wrong form"),
    ("profile-unknown", BASE + "    server:\n      profile: llama-70b\n",
     "hosts[0].server.profile: unknown profile 'llama-70b' (known: glm5-nvfp4-sm120, glm5-nvfp4-sm120-current) (line 30)"),
    ("bind-exposed-no-key", BASE + "    server:\n      bind: 0.0.0.0\n",
     "hosts[0].server: bind 0.0.0.0 is reachable from other machines: set api_key (line 29)"),
    ("flag-not-long", BASE + "    server:\n      flags: {tp: 4}\n",
     "hosts[0].server.flags: 'tp' is not a long flag like --max-running-requests (line 30)"),
    ("flag-port-via-flags", BASE + "    server:\n      flags: {--port: 8000}\n",
     "hosts[0].server.flags: --port is set by server.port, not server.flags (line 30)"),
    ("port-range", BASE + "    server:\n      port: 70000\n",
     "hosts[0].server.port: must be <= 65535 (line 30)"),
    ("cuda-old", BASE + "    image:\n      pins: {cuda: '12.4'}\n",
     "hosts[0].image.pins.cuda: CUDA 12.4 cannot build for SM120: needs >= 12.8 (line 30)"),
    ("transformers-old", BASE + "    image:\n      pins: {transformers: '4.57.1'}\n",
     "hosts[0].image.pins.transformers: transformers 4.57.1 cannot read GLM-5's config (glm_moe_dsa): needs >= 5.2 (line 30)"),
    ("stand-in-outside-lab", BASE + "    image:\n      lab_stand_in: fake-sglang\n",
     "hosts[0]: image.lab_stand_in runs a fake server: only a lab host (lab: true) may set it (line 3)"),
    ("stand-in-unknown", BASE + "    lab: true\n    image:\n      lab_stand_in: vllm\n",
     "hosts[0].image.lab_stand_in: must be 'fake-sglang' (line 31)"),
    ("duplicate-key", mutate("cores: 32", "cores: 32\n      cores: 16"),
     "hosts[0].container.cores: duplicate key (first given on line 20) (line 21)"),
    ("duplicate-host", BASE + BASE.split("hosts:\n")[1],
     "hosts[1].name: name 'pve1' repeats hosts[0] (line 29)"),
    ("tls-contradiction", mutate("      node: pve1", "      node: pve1\n      tls: {verify: false, ca_file: /ca.pem}"),
     "hosts[0].api.tls: verify is false but ca_file/fingerprint is set: choose one (line 9)"),
    ("fingerprint-short", mutate("      node: pve1", "      node: pve1\n      tls: {fingerprint: 'AB:CD'}"),
     "hosts[0].api.tls.fingerprint: has the wrong form"),
    ("top-is-list", "- version: 1\n", "(top level): must be a mapping with 'version' and 'hosts' (line 1)"),
    ("yaml-syntax", mutate("cores: 32", "cores: [32"),
     "YAML syntax error"),
    ("two-documents", BASE + "---\nversion: 1\n", "holds 2 YAML documents; a host file is one document"),
    ("empty-file", "", "is empty"),
    ("not-a-mapping-section", mutate("    driver:\n      version: \"580.95.05\"", "    driver: 580"),
     "hosts[0].driver: must be a mapping (key: value) (line 12)"),
]


def test_enough_cases() -> None:
    assert len(CASES) >= 25
    assert len({case[0] for case in CASES}) == len(CASES)
    assert len({case[2] for case in CASES}) == len(CASES), "each malformed file has its own message"


def test_base_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "host.yml"
    path.write_text(BASE)
    loaded = hostfile.load(path)
    assert loaded.hosts[0].container.memory_gb == 256


@pytest.mark.parametrize("text,expected", [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_in_process(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "host.yml"
    path.write_text(text)
    with pytest.raises(hostfile.HostFileError) as caught:
        hostfile.load(path)
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems
    for problem in caught.value.problems:
        assert "\n" not in problem and problem.startswith(str(path))


@pytest.mark.parametrize("case", CASES[:8] + CASES[-4:], ids=[c[0] for c in CASES[:8] + CASES[-4:]])
def test_malformed_cli_exit_2_no_traceback_no_state(tmp_path: Path, gpunode, case: tuple[str, str, str]) -> None:
    path = tmp_path / "host.yml"
    path.write_text(case[1])
    for verb in ("plan", "provision"):
        result = gpunode(verb, str(path))
        assert result.returncode == 2, result.stderr
        assert case[2] in result.stderr
        assert "Traceback" not in result.stderr and result.stdout == ""
        assert all(line.startswith("error: ") for line in result.stderr.splitlines())
    # Nothing was changed: not even the state directory was created.
    assert not (tmp_path / "state").exists()


def test_inline_secret_is_not_echoed(tmp_path: Path, gpunode) -> None:
    path = tmp_path / "host.yml"
    path.write_text(mutate("password: {env: PVE_PASS}", "password: S3cr3t-Value-xyz"))
    result = gpunode("plan", str(path))
    assert result.returncode == 2
    assert "S3cr3t-Value-xyz" not in result.stderr + result.stdout


def test_every_problem_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "host.yml"
    path.write_text(mutate("memory_gb: 256", "memory_gb: 0").replace("cores: 32", "cores: 0"))
    with pytest.raises(hostfile.HostFileError) as caught:
        hostfile.load(path)
    assert [p.split(": ", 1)[1] for p in caught.value.problems] == [
        "hosts[0].container.cores: must be > 0 (line 20)",
        "hosts[0].container.memory_gb: must be > 0 (line 21)",
    ]


def test_missing_file(gpunode, tmp_path: Path) -> None:
    result = gpunode("plan", str(tmp_path / "nope.yml"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {tmp_path / 'nope.yml'}: no such file"


@pytest.mark.parametrize("path", ["inventory/example/host.yml", "inventory/lab/host.yml"])
def test_shipped_host_files_are_valid(path: str) -> None:
    loaded = hostfile.load(ROOT / path)
    assert loaded.hosts


def test_secret_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret_file = tmp_path / "pass"
    secret_file.write_text("from-file\n")
    assert hostfile.SecretRef(file=secret_file).resolve() == "from-file"
    monkeypatch.setenv("GPUNODE_T_SECRET", "from-env")
    assert hostfile.SecretRef(env="GPUNODE_T_SECRET").resolve() == "from-env"
    monkeypatch.delenv("GPUNODE_T_SECRET")
    with pytest.raises(LookupError, match="GPUNODE_T_SECRET is not set"):
        hostfile.SecretRef(env="GPUNODE_T_SECRET").resolve()


# -- hostile YAML: refused fast, one line, exit 2 ----------------------------------------------
LAUGHS = """\
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


@pytest.mark.parametrize("text, expected", [
    (LAUGHS, r"YAML aliases expand past 10000 values.*\(line \d+\)"),
    ("version: 1\nhosts: &h\n  - name: pve1\n    more: *h\n", r"alias refers to the value that holds it \(line \d+\)"),
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", r"nested too deeply"),
])
def test_hostile_yaml_is_refused_fast(tmp_path: Path, gpunode, text: str, expected: str) -> None:
    import re

    # How fast: benchmarks/bad_input.py (well under a second; 38 s and 2.4 GB before the bound).
    path = tmp_path / "host.yml"
    path.write_text(text)
    with pytest.raises(hostfile.HostFileError) as caught:
        hostfile.load(path)
    assert len(caught.value.problems) == 1 and re.search(expected, caught.value.problems[0])
    result = gpunode("validate", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and re.search(expected, result.stderr)

