"""The host file's rules match what the run will do (issue #31): the tensor-parallel size under
every name sglang's parser takes, flags gpunode sets itself, GPU minors, what gpunode would make
twice, addresses and user names, credentials in URLs and secrets in server.env/flags, and what
`gpunode plan` needs. Each rule: one line naming the path, what is wrong and the key to use, and
`gpunode validate` exits 2 without creating anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpunode import hostfile
from gpunode.cli import app

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "inventory" / "lab" / "fleet.yml"
STANDIN = ROOT / "src" / "gpunode" / "images" / "sglang" / "args"  # each release's parser, dumped
PROFILE = "glm5-nvfp4-sm120"  # the seeds' stack's profile: --tp-size 8
RELEASE = "sglang 0.5.9 (stack sglang-0.5.9-cu128)"
SECRET_REF = "{env: NAME}, {file: PATH} or {vault: PATH}"
ADDRESS_RULE = ("is not an IP address or a DNS name (RFC 1123: dot-separated labels of letters, digits and '-', "
                "none starting or ending with '-', <= 63 characters each, <= 253 in all)")
USER_RULE = "is not a user name (letters a-z, digits, '_' and '-', starting with a letter or '_', <= 32 characters)"
SECRET_FLAG = (f"carries a secret, never inline (plan prints server.flags): server.flags takes no secret reference; "
               f"the server's key is server.api_key ({SECRET_REF})")
SECRET_ENV = (f"names a secret, never inline (plan prints server.env, docker inspect shows it): server.env takes no "
              f"secret reference; the server's key is server.api_key ({SECRET_REF}), and the weights are local "
              "(model.path)")
USER_INFO = "its value is a URL with user information (user@ or user:password@): credentials are never inline"

HOST = """\
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
BASE = "version: 1\nhosts:\n" + HOST


def mutate(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def line(text: str, needle: str, after: str = "") -> int:
    """The line (1-based) of the first ``needle`` in ``text`` after the first ``after``."""
    start = text.index(after) if after else 0
    return text.count("\n", 0, text.index(needle, start)) + 1


def server(*lines: str, text: str = BASE) -> str:
    """``text`` with a server section of these lines (each indented under server:)."""
    return text + "    server:\n" + "".join(f"      {entry}\n" for entry in lines)


def flags(*entries: str, text: str = BASE) -> str:
    return server("flags:", *(f"  {entry}" for entry in entries), text=text)


def second_host(*changes: tuple[str, str]) -> str:
    """A second host: the first with another name, vmid, hostname and addresses, then ``changes``."""
    host = HOST.replace("name: pve1", "name: pve2").replace("vmid: 200", "vmid: 201")
    host = host.replace("hostname: glm5", "hostname: glm5-b").replace("192.0.2.10", "192.0.2.11")
    host = host.replace("ip: 192.0.2.20/24", "ip: 192.0.2.21/24")
    for old, new in changes:
        host = mutate(host, old, new)
    return BASE + host


@pytest.fixture(autouse=True)
def state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("GPUNODE_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def validate(path: Path):
    return CliRunner().invoke(app, ["validate", str(path)])


def refused(tmp_path: Path, text: str) -> str:
    """`gpunode validate` on ``text``: exit 2, nothing on stdout, one error line, no state; returns
    the line without 'error: <file>: '."""
    path = tmp_path / "host.yml"
    path.write_text(text)
    result = validate(path)
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), result.stderr
    assert not (tmp_path / "state").exists()
    return lines[0].removeprefix(f"error: {path}: ")


def accepted(tmp_path: Path, text: str) -> hostfile.HostFile:
    path = tmp_path / "host.yml"
    path.write_text(text)
    result = validate(path)
    assert result.exit_code == 0, result.output
    return hostfile.load(path)


def problems(tmp_path: Path, text: str) -> list[str]:
    """In process, for the rules tried on many values."""
    path = tmp_path / "host.yml"
    path.write_text(text)
    with pytest.raises(hostfile.HostFileError) as caught:
        hostfile.load(path)
    return [problem.removeprefix(f"{path}: ") for problem in caught.value.problems]


def dumped(version: str) -> dict[str, list[str]]:
    """Option string -> every option string of its argument, read from the stand-in's dump of
    sglang ``version``'s own parser."""
    data = json.loads((STANDIN / f"sglang_{version.replace('.', '_')}_args.json").read_text())
    return {flag: action["flags"] for action in data["actions"] for flag in action["flags"]}


def test_base_is_valid(tmp_path: Path) -> None:
    assert accepted(tmp_path, BASE).hosts[0].container.gpus == list(range(8))


# -- the tensor-parallel size ------------------------------------------------------------------
@pytest.mark.parametrize("given", ['"16"', "16", "4"])
def test_tp_must_be_the_gpus_selected(tmp_path: Path, given: str) -> None:
    text = flags(f'"--tp-size": {given}')
    tp = given.strip('"')
    assert refused(tmp_path, text) == (
        f"hosts[0].server.flags.--tp-size: server --tp-size {tp} needs {tp} GPUs but container.gpus selects 8: "
        f"make them equal (the server is given every GPU selected) (line {line(text, '--tp-size')})")


def test_the_profiles_tp_must_be_the_gpus_selected(tmp_path: Path) -> None:
    text = mutate(BASE, "gpus: [0, 1, 2, 3, 4, 5, 6, 7]", "gpus: [0, 1, 2, 3, 4, 5]")
    assert refused(tmp_path, text) == (
        f"hosts[0].container.gpus: server --tp-size 8 (profile {PROFILE}) needs 8 GPUs but container.gpus selects 6: "
        f"make them equal (the server is given every GPU selected) (line {line(text, 'gpus:')})")


def test_tp_equal_to_the_gpus_is_valid_as_number_or_digits(tmp_path: Path) -> None:
    four = mutate(BASE, "gpus: [0, 1, 2, 3, 4, 5, 6, 7]", "gpus: [4, 5, 6, 7]")
    assert accepted(tmp_path, flags('"--tp-size": 4', text=four)).hosts[0].server.flags == {"--tp-size": 4}
    assert accepted(tmp_path, flags('"--tp-size": "8"')).hosts[0].server.flags == {"--tp-size": "8"}


@pytest.mark.parametrize("given", ["0", "-8"])
def test_tp_is_at_least_one(tmp_path: Path, given: str) -> None:
    text = flags(f'"--tp-size": {given}')
    assert refused(tmp_path, text) == (
        f"hosts[0].server.flags.--tp-size: --tp-size {given}: the tensor-parallel size is a whole number >= 1, the "
        f"GPUs the server shards the model over (line {line(text, '--tp-size')})")


@pytest.mark.parametrize(("given", "shown"), [('"eight"', "'eight'"), ("8.5", "8.5"), ('"8.0"', "'8.0'")])
def test_tp_is_a_whole_number(tmp_path: Path, given: str, shown: str) -> None:
    text = flags(f'"--tp-size": {given}')
    assert refused(tmp_path, text) == (
        f"hosts[0].server.flags.--tp-size: --tp-size takes a whole number, not {shown} (line {line(text, '--tp-size')})")


def test_tp_left_out_is_sglangs_default_of_one(tmp_path: Path) -> None:
    text = flags('"--tp-size": false')
    assert refused(tmp_path, text) == (
        "hosts[0].server.flags.--tp-size: server --tp-size: false (sglang's default tensor-parallel size, 1) needs 1 "
        f"GPUs but container.gpus selects 8: make them equal (the server is given every GPU selected) "
        f"(line {line(text, '--tp-size')})")


@pytest.mark.parametrize("given", ["true", "null"])
def test_tp_needs_a_value(tmp_path: Path, given: str) -> None:
    text = flags(f'"--tp-size": {given}')
    assert refused(tmp_path, text) == f"hosts[0].server.flags.--tp-size: --tp-size needs a value (line {line(text, '--tp-size')})"


def tp_names(version: str) -> list[tuple[str, tuple[str, ...]]]:
    """Every other name argparse takes for the tensor-parallel size than the profile's --tp-size,
    and every prefix of those it would refuse as ambiguous, each with the option strings it begins:
    from the dump, not by hand."""
    table = dumped(version)
    names: set[tuple[str, tuple[str, ...]]] = set()
    for full in table["--tp-size"]:
        for end in range(len("--t"), len(full) + 1):
            prefix = full[:end]
            matches = [prefix] if prefix in table else sorted(name for name in table if name.startswith(prefix))
            names.add((prefix, tuple(matches)))
    return sorted(names - {("--tp-size", ("--tp-size",))})


# Each stack's release, its profile and the host file that runs it.
RELEASES = {"0.5.9": (PROFILE, RELEASE, BASE),
            "0.5.23": ("glm5-nvfp4-sm120-current", "sglang 0.5.23 (stack sglang-0.5.23-cu130)",
                       BASE + "    image:\n      stack: sglang-0.5.23-cu130\n")}
TP_NAMES = [(version, name, matches) for version in RELEASES for name, matches in tp_names(version)]


@pytest.mark.parametrize(("version", "name", "matches"), TP_NAMES, ids=[f"{v}:{n}" for v, n, _ in TP_NAMES])
def test_every_name_of_tp_but_the_profiles_is_refused(tmp_path: Path, version: str, name: str,
                                                      matches: tuple[str, ...]) -> None:
    profile, release, base = RELEASES[version]
    text = flags(f'"{name}": 8', text=base)
    found = problems(tmp_path, text)
    where = f"hosts[0].server.flags.{name}"
    if len(matches) > 1:
        assert found == [f"{where}: {name} is ambiguous in {release}: it begins {', '.join(matches[:6])}"
                         f"{', ...' if len(matches) > 6 else ''}: write the flag in full (line {line(text, name)})"]
    else:
        assert found == [f"{where}: {name} is --tp-size by another name, which profile {profile} sets: write "
                         "--tp-size, so that this value replaces the profile's instead of both reaching sglang "
                         f"(line {line(text, name)})"]


def test_without_tp_in_the_profile_tp_is_given_by_its_full_names(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile that leaves the TP size to the host file: an abbreviation would reach sglang, but
    not derive, which reads the size (for the P2P stage and the bench) by its full names."""
    import dataclasses

    from gpunode import derive

    from gpunode.catalogue import profiles

    load = profiles.load
    monkeypatch.setattr(profiles, "load", lambda name: dataclasses.replace(
        load(name), flags=tuple(item for item in load(name).flags if item.flag != "--tp-size")))
    text = flags('"--tp": 8')
    assert refused(tmp_path, text) == (
        f"hosts[0].server.flags.--tp: --tp abbreviates --tp-size: write --tp-size or --tensor-parallel-size in full "
        f"(line {line(text, '--tp')})")
    loaded = accepted(tmp_path, flags('"--tensor-parallel-size": 8'))
    assert derive.derive(loaded.hosts[0]).tp_size == 8


def test_the_profiles_own_name_of_tp_is_valid(tmp_path: Path) -> None:
    assert accepted(tmp_path, flags('"--tp-size": 8')).hosts[0].server.flags == {"--tp-size": 8}


def test_tp_aliases_reach_the_cli_as_one_line(tmp_path: Path) -> None:
    text = flags('"--tp": 4')
    assert refused(tmp_path, text) == (
        f"hosts[0].server.flags.--tp: --tp is --tp-size by another name, which profile {PROFILE} sets: write "
        f"--tp-size, so that this value replaces the profile's instead of both reaching sglang (line {line(text, '--tp')})")


def test_data_parallel_needs_dp_attention(tmp_path: Path) -> None:
    text = flags('"--dp-size": 2')
    assert refused(tmp_path, text) == (
        "hosts[0].server.flags.--dp-size: --dp-size 2 runs 2 copies of the model, 2 x 8 GPUs, but gpunode gives one "
        "server one tensor-parallel group: leave it 1, or add --enable-dp-attention (its DP ranks share the TP GPUs) "
        f"(line {line(text, '--dp-size')})")


def test_data_parallel_attention_divides_tp(tmp_path: Path) -> None:
    text = flags('"--enable-dp-attention": true', '"--dp-size": 3')
    assert refused(tmp_path, text) == (
        "hosts[0].server.flags.--dp-size: --dp-size 3 must divide the tensor-parallel size 8 with "
        f"--enable-dp-attention (line {line(text, '--dp-size')})")
    assert accepted(tmp_path, flags('"--enable-dp-attention": true', '"--dp-size": 2')).hosts


# -- flags gpunode sets itself -----------------------------------------------------------------
@pytest.mark.parametrize(("flag", "key"), [
    ("--model-path", "model.path"), ("--model", "model.path"), ("--served-model-name", "model.served_name"),
    ("--host", "server.bind"), ("--port", "server.port")])
def test_a_flag_gpunode_sets_names_its_key(tmp_path: Path, flag: str, key: str) -> None:
    text = flags(f'"{flag}": x')
    assert refused(tmp_path, text) == (
        f"hosts[0].server.flags: {flag} is set by {key}, not server.flags (line {line(text, 'flags:', after='server:')})")


def test_config_would_read_flags_past_the_checks(tmp_path: Path) -> None:
    text = flags('"--config": /etc/sglang.yaml')
    assert refused(tmp_path, text) == (
        "hosts[0].server.flags: --config reads sglang's flags from a file, past every check here: give each flag "
        f"under server.flags (line {line(text, 'flags:', after='server:')})")


@pytest.mark.parametrize(("abbreviation", "full", "key"), [
    ("--served-model", "--served-model-name", "model.served_name"), ("--model-pa", "--model-path", "model.path"),
    ("--confi", "--config", None)])
def test_an_abbreviation_of_a_flag_gpunode_sets_names_its_key(tmp_path: Path, abbreviation: str, full: str,
                                                             key: str | None) -> None:
    # Each is an abbreviation argparse takes: it begins one option string of the release alone.
    assert [name for name in dumped("0.5.9") if name.startswith(abbreviation)] == [full]
    text = flags(f'"{abbreviation}": x')
    why = (f"is set by {key}, not server.flags" if key else
           "reads sglang's flags from a file, past every check here: give each flag under server.flags")
    assert refused(tmp_path, text) == (
        f"hosts[0].server.flags.{abbreviation}: {abbreviation} abbreviates {full}, which {why} "
        f"(line {line(text, abbreviation)})")


# -- secrets in flags and the environment ------------------------------------------------------
@pytest.mark.parametrize("flag", ["--api-key", "--admin-api-key", "--hub-token", "--db-password"])
def test_a_flag_carrying_a_secret_takes_none_inline(tmp_path: Path, flag: str) -> None:
    text = flags(f'"{flag}": S3cr3t-inline')
    message = refused(tmp_path, text)
    assert message == f"hosts[0].server.flags: {flag} {SECRET_FLAG} (line {line(text, 'flags:', after='server:')})"
    assert "S3cr3t" not in message


def test_an_abbreviation_of_a_secret_flag_takes_none_inline(tmp_path: Path) -> None:
    assert [name for name in dumped("0.5.9") if name.startswith("--admin-api")] == ["--admin-api-key"]
    text = flags('"--admin-api": S3cr3t-inline')
    message = refused(tmp_path, text)
    assert message == (f"hosts[0].server.flags.--admin-api: --admin-api abbreviates --admin-api-key, which "
                       f"{SECRET_FLAG} (line {line(text, '--admin-api')})")


@pytest.mark.parametrize("name", ["HF_TOKEN", "hf_token", "OPENAI_API_KEY", "DB_PASSWORD", "MY_SECRET_THING", "TOKEN"])
def test_a_secret_in_server_env_is_refused(tmp_path: Path, name: str) -> None:
    text = server("env:", f"  {name}: hf_S3cr3tInline")
    message = refused(tmp_path, text)
    assert message == f"hosts[0].server.env: {name} {SECRET_ENV} (line {line(text, 'env:', after='server:')})"
    assert "S3cr3t" not in message


def test_plain_server_env_is_valid(tmp_path: Path) -> None:
    loaded = accepted(tmp_path, server("env:", "  NCCL_DEBUG: INFO", "  HF_HUB_OFFLINE: '1'"))
    assert loaded.hosts[0].server.env == {"NCCL_DEBUG": "INFO", "HF_HUB_OFFLINE": "1"}


def test_a_hub_endpoint_with_credentials_is_refused(tmp_path: Path) -> None:
    text = server("env:", "  HF_ENDPOINT: https://me:S3cr3t@hub.example.com")
    message = refused(tmp_path, text)
    assert message == f"hosts[0].server.env: HF_ENDPOINT: {USER_INFO} (line {line(text, 'env:', after='server:')})"
    assert "S3cr3t" not in message


def test_a_flag_value_with_credentials_is_refused(tmp_path: Path) -> None:
    text = flags('"--otlp-traces-endpoint": "http://me:S3cr3t@otel.example.com:4317"')
    message = refused(tmp_path, text)
    assert message == f"hosts[0].server.flags: --otlp-traces-endpoint: {USER_INFO} (line {line(text, 'flags:', after='server:')})"
    assert "S3cr3t" not in message


@pytest.mark.parametrize("name", ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"])
def test_the_gpus_are_container_gpus_not_server_env(tmp_path: Path, name: str) -> None:
    text = server("env:", f"  {name}: '0,1'")
    assert refused(tmp_path, text) == (
        f"hosts[0].server.env: {name} would change the GPUs the server sees: select them with container.gpus "
        f"(line {line(text, 'env:', after='server:')})")


# -- every flag one the stack's sglang takes, by one name, with a value of its type ------------
def test_an_unknown_flag_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    text = flags('"--max-runing-requests": 512')
    assert refused(tmp_path, text) == (
        f"hosts[0].server.flags.--max-runing-requests: --max-runing-requests is not a flag of {RELEASE} (did you mean "
        f"--max-running-requests?) (line {line(text, '--max-runing')})")


def test_flags_are_those_of_the_stacks_own_release(tmp_path: Path) -> None:
    """0.5.9's --nsa-prefill-backend is 0.5.23's --dsa-prefill-backend: the current stack refuses it."""
    assert "--nsa-prefill-backend" in dumped("0.5.9") and "--nsa-prefill-backend" not in dumped("0.5.23")
    current = BASE + "    image:\n      stack: sglang-0.5.23-cu130\n"
    text = flags('"--nsa-prefill-backend": flashinfer', text=current)
    assert refused(tmp_path, text) == (
        "hosts[0].server.flags.--nsa-prefill-backend: --nsa-prefill-backend is not a flag of sglang 0.5.23 (stack "
        f"sglang-0.5.23-cu130) (did you mean --dsa-prefill-backend?) (line {line(text, '--nsa-prefill')})")


def test_an_ambiguous_abbreviation_is_refused(tmp_path: Path) -> None:
    """The profile's own note: --cuda-graph-max-bs is ambiguous in 0.5.23."""
    current = BASE + "    image:\n      stack: sglang-0.5.23-cu130\n"
    begun = sorted(name for name in dumped("0.5.23") if name.startswith("--cuda-graph-max-bs"))
    assert len(begun) > 1
    text = flags('"--cuda-graph-max-bs": 128', text=current)
    assert refused(tmp_path, text) == (
        "hosts[0].server.flags.--cuda-graph-max-bs: --cuda-graph-max-bs is ambiguous in sglang 0.5.23 (stack "
        f"sglang-0.5.23-cu130): it begins {', '.join(begun)}: write the flag in full "
        f"(line {line(text, '--cuda-graph-max-bs')})")


@pytest.mark.parametrize(("entry", "why"), [
    ('"--trust-remote-code": "yes"', "--trust-remote-code is a switch: give true, or false to leave it out, not 'yes'"),
    ('"--max-running-requests": lots', "--max-running-requests takes a whole number, not 'lots'"),
    ('"--mem-fraction-static": most', "--mem-fraction-static takes a number, not 'most'"),
    ('"--chunked-prefill-size": null', "--chunked-prefill-size needs a value")])
def test_a_value_sglangs_parser_refuses_is_refused(tmp_path: Path, entry: str, why: str) -> None:
    text = flags(entry)
    flag = entry.split('"')[1]
    assert refused(tmp_path, text) == f"hosts[0].server.flags.{flag}: {why} (line {line(text, flag)})"


def test_a_value_outside_the_choices_is_refused(tmp_path: Path) -> None:
    text = flags('"--kv-cache-dtype": fp9')
    message = refused(tmp_path, text)
    assert message.startswith("hosts[0].server.flags.--kv-cache-dtype: --kv-cache-dtype takes one of auto, ")
    assert message.endswith(f", not 'fp9' (line {line(text, '--kv-cache-dtype')})")


def test_a_profile_flag_by_another_name_is_refused(tmp_path: Path) -> None:
    text = flags('"--mem-frac": 0.8')
    assert refused(tmp_path, text) == (
        f"hosts[0].server.flags.--mem-frac: --mem-frac is --mem-fraction-static by another name, which profile "
        f"{PROFILE} sets: write --mem-fraction-static, so that this value replaces the profile's instead of both "
        f"reaching sglang (line {line(text, '--mem-frac')})")


def test_one_flag_by_two_names_is_refused(tmp_path: Path) -> None:
    text = flags('"--max-total-tokens": 4096', '"--max-total": 8192')
    second = line(text, '"--max-total":')
    assert refused(tmp_path, text) == (
        "hosts[0].server.flags.--max-total: --max-total is --max-total-tokens again, by another name: give it once "
        f"(line {second})")


def test_an_abbreviation_of_a_flag_the_profile_leaves_alone_is_valid(tmp_path: Path) -> None:
    assert [name for name in dumped("0.5.9") if name.startswith("--max-total")] == ["--max-total-tokens"]
    assert accepted(tmp_path, flags('"--max-total": 4096')).hosts[0].server.flags == {"--max-total": 4096}


# -- GPU minors ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("minor", "why"), [
    (254, "254 is the minor of /dev/nvidia-modeset, not of a GPU (GPUs are 0-247)"),
    (255, "255 is the minor of /dev/nvidiactl, not of a GPU (GPUs are 0-247)"),
    (248, "248 is beyond the driver's GPU minors (0-247)")])
def test_a_gpu_minor_is_a_gpus(tmp_path: Path, minor: int, why: str) -> None:
    text = mutate(BASE, "gpus: [0, 1, 2, 3, 4, 5, 6, 7]", f"gpus: [0, 1, 2, 3, 4, 5, 6, {minor}]")
    assert refused(tmp_path, text) == f"hosts[0].container.gpus: {why} (line {line(text, 'gpus:')})"


def test_the_last_gpu_minors_are_valid(tmp_path: Path) -> None:
    text = mutate(BASE, "gpus: [0, 1, 2, 3, 4, 5, 6, 7]", f"gpus: {list(range(240, 248))}")
    assert accepted(tmp_path, text).hosts[0].container.gpus == list(range(240, 248))


# -- what gpunode would make twice --------------------------------------------------------------
def test_one_vmid_per_proxmox_api(tmp_path: Path) -> None:
    # The same API written with a trailing slash, another node of its cluster: still one vmid space.
    text = second_host(("vmid: 201", "vmid: 200"), ("url: https://192.0.2.11:8006", "url: https://192.0.2.10:8006/"),
                       ("node: pve1", "node: pve2"))
    assert refused(tmp_path, text) == (
        "hosts[1].container.vmid: vmid 200 repeats hosts[0]'s on the same Proxmox API https://192.0.2.10:8006/ (one "
        f"vmid per cluster): give another (line {line(text, 'vmid: 200', after='name: pve2')})")


def test_the_same_vmid_on_another_api_is_valid(tmp_path: Path) -> None:
    loaded = accepted(tmp_path, second_host(("vmid: 201", "vmid: 200")))
    assert [host.container.vmid for host in loaded.hosts] == [200, 200]


def test_one_hostname_per_node(tmp_path: Path) -> None:
    text = second_host(("url: https://192.0.2.11:8006", "url: https://192.0.2.10:8006"),
                       ("hostname: glm5-b", "hostname: glm5"))
    assert refused(tmp_path, text) == (
        "hosts[1].container.hostname: 'glm5' repeats hosts[0]'s container on node pve1 of https://192.0.2.10:8006: "
        f"give another (line {line(text, 'hostname: glm5', after='name: pve2')})")


def test_one_container_address(tmp_path: Path) -> None:
    text = second_host(("ip: 192.0.2.21/24", "ip: 192.0.2.20/24"),
                       ("      gpus:", "      ssh: {address: 198.51.100.21}\n      gpus:"))
    assert refused(tmp_path, text) == (
        "hosts[1].container.network.ip: 192.0.2.20 repeats hosts[0]'s container address: give another "
        f"(line {line(text, 'ip: 192.0.2.20/24', after='name: pve2')})")


def test_the_server_port_is_not_the_nodes_ssh_port(tmp_path: Path) -> None:
    text = server("port: 22")
    assert refused(tmp_path, text) == (
        f"hosts[0].server.port: 22 is taken on pve1's node by its SSH server (container.ssh.port) "
        f"(line {line(text, 'port: 22')})")


def fleet(change) -> str:
    data = yaml.safe_load(FLEET.read_text())
    change(data)
    return yaml.safe_dump(data, sort_keys=False)


def test_a_router_at_a_nodes_address_shares_its_ports(tmp_path: Path) -> None:
    """runs_on an SSH address that is pve-lab1's node: the same machine as runs_on: pve-lab1."""
    text = fleet(lambda d: d["router"].update(runs_on={"address": "10.0.3.14"}, port=30000))
    assert refused(tmp_path, text) == (
        f"router.port: 30000 is taken on pve-lab1's node by its server (line {line(text, 'port: 30000', after='router:')})")


def test_the_router_port_is_not_its_machines_ssh_port(tmp_path: Path) -> None:
    text = fleet(lambda d: d["router"].update(runs_on={"address": "10.0.3.20", "port": 2222}, port=2222))
    assert refused(tmp_path, text) == (
        "router.port: 2222 is taken on the router's machine by its SSH server "
        f"(line {line(text, chr(10) + '  port: 2222', after='router:') + 1})")  # the router's own port key


# -- addresses and user names -------------------------------------------------------------------
BAD_ADDRESSES = ["-oProxyCommand=sh -c id", "-pve1", "pve1-", "a..b", "pve 1", "999.1.1.1", "x" * 64,
                 ".".join(["a" * 63] * 4) + ".b"]


@pytest.mark.parametrize("address", BAD_ADDRESSES, ids=range(len(BAD_ADDRESSES)))
def test_the_proxmox_hosts_address_is_an_address(tmp_path: Path, address: str) -> None:
    text = mutate(BASE, "address: 192.0.2.10", f"address: '{address}'")
    found = problems(tmp_path, text)
    assert len(found) == 1 and found[0].startswith("hosts[0].ssh.address: '")
    assert found[0].endswith(f" {ADDRESS_RULE} (line {line(text, 'address:')})")


def test_the_containers_address_is_an_address(tmp_path: Path) -> None:
    text = mutate(BASE, "      gpus:", "      ssh: {address: -oProxyCommand=id}\n      gpus:")
    assert refused(tmp_path, text) == (
        f"hosts[0].container.ssh.address: '-oProxyCommand=id' {ADDRESS_RULE} (line {line(text, 'ssh: {address')})")


def test_the_router_machines_address_is_an_address(tmp_path: Path) -> None:
    text = fleet(lambda d: d["router"].update(runs_on={"address": "-oProxyCommand=id"}))
    assert refused(tmp_path, text) == (
        f"router.runs_on.address: '-oProxyCommand=id' {ADDRESS_RULE} (line {line(text, 'address: -oProxy')})")


@pytest.mark.parametrize("address", ["2001:db8::10", "pve1.example.com", "PVE1", "pve-1.lan"])
def test_ip_addresses_and_dns_names_are_valid(tmp_path: Path, address: str) -> None:
    assert accepted(tmp_path, mutate(BASE, "address: 192.0.2.10", f"address: '{address}'")).hosts[0].ssh.address == address


@pytest.mark.parametrize("user", ["-oProxyCommand=id", "Root", "1root", "a" * 33, "ro ot"])
def test_the_ssh_user_is_a_user_name(tmp_path: Path, user: str) -> None:
    text = mutate(BASE, "address: 192.0.2.10", f"address: 192.0.2.10\n      user: '{user}'")
    assert refused(tmp_path, text) == f"hosts[0].ssh.user: '{user}' {USER_RULE} (line {line(text, 'user:')})"


def test_user_names_are_valid(tmp_path: Path) -> None:
    text = mutate(BASE, "address: 192.0.2.10", "address: 192.0.2.10\n      user: deploy_1")
    text = mutate(text, "      gpus:", "      ssh: {address: 192.0.2.20, user: _svc-gpu}\n      gpus:")
    loaded = accepted(tmp_path, text)
    assert (loaded.hosts[0].ssh.user, loaded.hosts[0].container.reach.user) == ("deploy_1", "_svc-gpu")


# -- credentials in URLs ------------------------------------------------------------------------
@pytest.mark.parametrize("url", ["https://root:S3cr3t@192.0.2.10:8006", "https://root@192.0.2.10:8006"])
def test_the_api_url_carries_no_credentials(tmp_path: Path, url: str) -> None:
    text = mutate(BASE, "url: https://192.0.2.10:8006", f"url: {url}")
    message = refused(tmp_path, text)
    assert message == (
        "hosts[0].api.url: the URL carries user information (user@ or user:password@), never inline: give the user "
        f"as api.auth.user and the password as api.auth.password (line {line(text, 'url:')})")
    assert "S3cr3t" not in message


def test_the_api_urls_host_is_an_address(tmp_path: Path) -> None:
    text = mutate(BASE, "url: https://192.0.2.10:8006", "url: https://-oProxyCommand=id:8006")
    assert refused(tmp_path, text) == f"hosts[0].api.url: '-oProxyCommand=id' {ADDRESS_RULE} (line {line(text, 'url:')})"


def test_the_installer_url_carries_no_credentials(tmp_path: Path) -> None:
    text = mutate(BASE, '      version: "580.95.05"\n', '      version: "580.95.05"\n      installer:\n        url: '
                  "https://me:S3cr3t@download.example.com/NVIDIA-Linux-x86_64-580.95.05.run\n        sha256: "
                  + "0" * 64 + "\n")
    message = refused(tmp_path, text)
    assert message == ("hosts[0].driver.installer.url: the URL carries user information (user@ or user:password@), "
                       f"never inline: a download URL takes none (or give local_file) (line {line(text, 'url: https://me')})")
    assert "S3cr3t" not in message


@pytest.mark.parametrize(("where", "text_of"), [
    ("hosts[0].image.base", lambda base: BASE + f"    image:\n      base: {base}\n"),
    ("router.image.base", lambda base: fleet(lambda d: d["router"]["image"].update(base=base)))])
def test_an_image_registry_carries_no_credentials(tmp_path: Path, where: str, text_of) -> None:
    text = text_of("me:S3cr3t@mirror.example.com/debian:bookworm-slim")
    message = refused(tmp_path, text)
    assert message == (f"{where}: the registry carries user information (user@ or user:password@), never inline: log "
                       f"the engine in to the registry (docker login) instead (line {line(text, 'me:S3cr3t')})")
    assert "S3cr3t" not in message


def test_a_registry_mirror_without_credentials_is_valid(tmp_path: Path) -> None:
    loaded = accepted(tmp_path, BASE + "    image:\n      base: mirror.example.com:5000/debian:bookworm-slim\n")
    assert loaded.hosts[0].image.base == "mirror.example.com:5000/debian:bookworm-slim"


# -- what plan needs ----------------------------------------------------------------------------
def test_a_missing_ca_bundle_is_refused_before_plan(tmp_path: Path) -> None:
    text = BASE + f"    image:\n      ca_bundle: {tmp_path / 'nope.pem'}\n"
    assert refused(tmp_path, text) == (
        f"hosts[0].image.ca_bundle: '{tmp_path / 'nope.pem'}' is not a readable file on this machine (the image's "
        f"build context takes it from here) (line {line(text, 'ca_bundle:')})")


def test_a_missing_router_ca_bundle_is_refused_before_plan(tmp_path: Path) -> None:
    text = fleet(lambda d: d["router"]["image"].update(ca_bundle=str(tmp_path / "nope.pem")))
    assert refused(tmp_path, text) == (
        f"router.image.ca_bundle: '{tmp_path / 'nope.pem'}' is not a readable file on this machine (the image's "
        f"build context takes it from here) (line {line(text, 'nope.pem')})")


def test_whatever_else_plan_cannot_compute_is_refused_by_validate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last rule: validate makes the plan, so no valid file has a plan that fails."""
    from gpunode.derive import plan
    from gpunode.derive.imagecontext import ImageInputError

    def fails(host: object) -> None:
        raise ImageInputError("images/sglang/base-packages.txt is missing")

    monkeypatch.setattr(plan, "plan_host", fails)
    assert refused(tmp_path, BASE) == "hosts[0]: plan cannot be made: images/sglang/base-packages.txt is missing (line 3)"


@pytest.mark.parametrize("path", sorted((ROOT / "inventory").rglob("*.yml")), ids=lambda p: p.name)
def test_every_shipped_host_file_validates_and_plans(path: Path) -> None:
    assert validate(path).exit_code == 0
    result = CliRunner().invoke(app, ["plan", "--json", str(path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["hosts"]
