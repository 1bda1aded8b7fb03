"""IPv4, IPv6 and dual stack in container.network (issue #32): each form the host file takes becomes
a net0 line whose address keys pass Proxmox's own format rules, transcribed below from their
source; each form it refuses gets one line naming the key to use; and an IPv6-only node is
reached at its IPv6 literal."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpunode import derive, hostfile, inventory

from gpunode.stages import engine
from gpunode.cli import app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventory" / "example" / "host.yml"
NETWORK = "        ip: 192.0.2.20/24\n        gateway: 192.0.2.1\n"  # the example's, replaced below


# -- Proxmox's rules, from its source ------------------------------------------------------------
# pve-common src/PVE/ParseUtils.pm, $IPV4OCTET / $IPV4RE: four decimal octets 0-255, no leading 0.
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = re.compile(rf"{_OCTET}(\.{_OCTET}){{3}}")


def pve_ipv4(text: str) -> bool:
    """pve-common src/PVE/JSONSchema.pm pve_verify_ipv4 (line 482): $IPV4RE, whole."""
    return _IPV4.fullmatch(text) is not None


def pve_ipv6(text: str) -> bool:
    """JSONSchema.pm pve_verify_ipv6 (line 494): $IPV6RE (ParseUtils.pm), RFC 3986's IPv6address
    (h16 groups, one ::, an IPv4 tail; no zone). The C library's inet_pton reads the same grammar,
    independently of the ipaddress module gpunode uses."""
    if "%" in text:
        return False
    try:
        socket.inet_pton(socket.AF_INET6, text)
    except OSError:
        return False
    return True


def pve_cidr(text: str, version: int) -> bool:
    """JSONSchema.pm pve_verify_cidrv4 (line 598) / pve_verify_cidrv6 (line 585): ADDRESS/(\\d+)
    with a prefix above 7, at most 32 / 128."""
    match = re.fullmatch(r"(.*)/(\d+)", text)
    if match is None:
        return False
    address, prefix = match.group(1), int(match.group(2))
    valid = pve_ipv4(address) if version == 4 else pve_ipv6(address)
    return valid and 7 < prefix <= (32 if version == 4 else 128)


def pve_ipv4_config(text: str) -> bool:
    """JSONSchema.pm pve_verify_ipv4_config (line 624): dhcp, manual or a CIDRv4."""
    return text in ("dhcp", "manual") or pve_cidr(text, 4)


def pve_ipv6_config(text: str) -> bool:
    """JSONSchema.pm pve_verify_ipv6_config (line 636): auto, dhcp, manual or a CIDRv6."""
    return text in ("auto", "dhcp", "manual") or pve_cidr(text, 6)


# pve-container src/PVE/LXC/Config.pm, the net format (lines 888-914): the format of each address key.
NET_FORMATS = {"ip": pve_ipv4_config, "gw": pve_ipv4, "ip6": pve_ipv6_config, "gw6": pve_ipv6}


def proxmox_refusals(net0: str) -> list[str]:
    """The address keys of a net0 line that Proxmox's formats refuse."""
    props = dict(part.split("=", 1) for part in net0.split(","))
    return [f"{key}={value}" for key, value in props.items() if key in NET_FORMATS and not NET_FORMATS[key](value)]


def test_the_transcribed_rules_refuse_what_proxmox_refuses() -> None:
    """The oracle itself: the cases Proxmox's source decides, both ways."""
    assert pve_ipv4_config("192.0.2.20/24") and pve_ipv4_config("dhcp") and pve_ipv4_config("10.0.0.1/8")
    assert not pve_ipv4_config("2001:db8::20/64")  # the bug of issue #32: IPv6 in ip=
    assert not pve_ipv4_config("10.0.0.1/7") and not pve_ipv4_config("192.0.2.020/24")
    assert pve_ipv6_config("2001:db8::20/64") and pve_ipv6_config("auto") and pve_ipv6_config("::ffff:192.0.2.1/128")
    assert not pve_ipv6_config("192.0.2.20/24") and not pve_ipv6_config("fe80::1%eth0/64")
    assert not pve_ipv6_config("2001:db8::/7") and not pve_ipv6_config("2001:db8::20")
    assert pve_ipv4("192.0.2.1") and not pve_ipv4("2001:db8::1")
    assert pve_ipv6("fe80::1") and not pve_ipv6("192.0.2.1")


# -- the host file -------------------------------------------------------------------------------
def host_file(tmp_path: Path, network: str, ssh: str = "") -> Path:
    """The example host file with ``network`` (lines under network:) and optionally a container.ssh."""
    text = EXAMPLE.read_text()
    assert NETWORK in text
    text = text.replace(NETWORK, "".join(f"        {line}\n" for line in network.splitlines()), 1)
    if ssh:
        text = text.replace("      gpus: [0, 1", f"      ssh: {ssh}\n      gpus: [0, 1", 1)
    path = tmp_path / "host.yml"
    path.write_text(text)
    return path


def loaded(tmp_path: Path, network: str, ssh: str = "") -> hostfile.Host:
    return hostfile.load(host_file(tmp_path, network, ssh)).hosts[0]


def refused(tmp_path: Path, network: str, ssh: str = "") -> list[str]:
    path = host_file(tmp_path, network, ssh)
    with pytest.raises(hostfile.HostFileError) as caught:
        hostfile.load(path)
    return [problem.removeprefix(f"{path}: ") for problem in caught.value.problems]


FORMS = [
    # (name, network lines, container.ssh, net0, the node's address)
    ("v4-cidr", "ip: 192.0.2.20/24\ngateway: 192.0.2.1", "",
     "name=eth0,bridge=vmbr0,ip=192.0.2.20/24,gw=192.0.2.1", "192.0.2.20"),
    ("v4-dhcp", "ip: dhcp", "{address: 192.0.2.30}",
     "name=eth0,bridge=vmbr0,ip=dhcp", "192.0.2.30"),
    ("v6-cidr", "ip: none\nip6: 2001:db8::20/64\ngateway6: 2001:db8::1", "",
     "name=eth0,bridge=vmbr0,ip6=2001:db8::20/64,gw6=2001:db8::1", "2001:db8::20"),
    ("v6-auto", "ip: none\nip6: auto", "{address: 2001:db8::99}",
     "name=eth0,bridge=vmbr0,ip6=auto", "2001:db8::99"),
    ("v6-dhcp", "ip: dhcp\nip6: dhcp", "{address: node.example.org}",
     "name=eth0,bridge=vmbr0,ip=dhcp,ip6=dhcp", "node.example.org"),
    ("dual-static", "ip: 192.0.2.20/24\ngateway: 192.0.2.1\nip6: 2001:db8::20/64\ngateway6: 2001:db8::1", "",
     "name=eth0,bridge=vmbr0,ip=192.0.2.20/24,gw=192.0.2.1,ip6=2001:db8::20/64,gw6=2001:db8::1", "192.0.2.20"),
    ("dual-dhcp4-static6", "ip: dhcp\nip6: 2001:db8::20/64\ngateway6: 2001:db8::1", "",
     "name=eth0,bridge=vmbr0,ip=dhcp,ip6=2001:db8::20/64,gw6=2001:db8::1", "2001:db8::20"),
    ("dual-static4-slaac", "ip: 192.0.2.20/24\ngateway: 192.0.2.1\nip6: auto\nvlan: 42", "",
     "name=eth0,bridge=vmbr0,ip=192.0.2.20/24,gw=192.0.2.1,ip6=auto,tag=42", "192.0.2.20"),
    ("v6-gateway-link-local", "ip: none\nip6: 2001:db8:0:1::20/64\ngateway6: fe80::1", "",
     "name=eth0,bridge=vmbr0,ip6=2001:db8:0:1::20/64,gw6=fe80::1", "2001:db8:0:1::20"),
    ("v6-written-long", "ip: none\nip6: 2001:DB8:0:0::0020/64\ngateway6: 2001:0db8::0001", "",
     "name=eth0,bridge=vmbr0,ip6=2001:db8::20/64,gw6=2001:db8::1", "2001:db8::20"),
]


@pytest.mark.parametrize("name, network, ssh, net0, address", FORMS, ids=[form[0] for form in FORMS])
def test_each_form_becomes_a_net0_proxmox_takes(tmp_path: Path, name: str, network: str, ssh: str, net0: str,
                                                address: str) -> None:
    host = loaded(tmp_path, network, ssh)
    line = derive.net0(host.container)
    assert line == net0
    assert proxmox_refusals(line) == []
    assert host.container.reach.address == address


def test_the_old_net0_for_ipv6_is_what_proxmox_refuses(tmp_path: Path) -> None:
    """What gpunode sent before (issue #32, item 6) fails Proxmox's ip format; what it sends now passes."""
    assert proxmox_refusals("name=eth0,bridge=vmbr0,ip=2001:db8::20/64,gw=2001:db8::1") == [
        "ip=2001:db8::20/64", "gw=2001:db8::1"]
    host = loaded(tmp_path, "ip: none\nip6: 2001:db8::20/64\ngateway6: 2001:db8::1")
    assert proxmox_refusals(derive.net0(host.container)) == []


REFUSED = [
    # (name, network lines, container.ssh, the key, the message); "proxmox" marks a value Proxmox refuses too
    ("v6-in-ip", "ip: 2001:db8::20/64", "", "ip",
     "'2001:db8::20/64' is an IPv6 address: give it as ip6 (Proxmox's ip is IPv4 only)"),
    ("v4-in-ip6", "ip: none\nip6: 192.0.2.20/24", "", "ip6",
     "'192.0.2.20/24' is an IPv4 address: give it as ip (Proxmox's ip6 is IPv6 only)"),
    ("v6-gateway", "ip: 192.0.2.20/24\ngateway: 2001:db8::1", "", "gateway",
     "'2001:db8::1' is an IPv6 address: give it as gateway6 (Proxmox's gw is IPv4 only)"),
    ("v4-gateway6", "ip: none\nip6: 2001:db8::20/64\ngateway6: 192.0.2.1", "", "gateway6",
     "'192.0.2.1' is an IPv4 address: give it as gateway (Proxmox's gw6 is IPv6 only)"),
    ("gw6-outside", "ip: none\nip6: 2001:db8::20/64\ngateway6: 2001:db8:1::1", "", "",
     "gateway6 2001:db8:1::1 is outside 2001:db8::/64 (and not link-local, fe80::/10)"),
    ("gw6-without-ip6", "ip: 192.0.2.20/24\ngateway6: 2001:db8::1", "", "",
     "gateway6 is set but ip6 is not"),
    ("gw6-with-slaac", "ip: none\nip6: auto\ngateway6: fe80::1", "{address: 2001:db8::99}", "",
     "gateway6 is set but ip6 is auto: the router's advertisements give the route"),
    ("ip6-no-prefix", "ip: none\nip6: 2001:db8::20", "", "ip6",
     "'2001:db8::20' needs a prefix length, e.g. 2001:db8::20/64"),
    ("ip6-short-prefix", "ip: none\nip6: 2001:db8::20/7", "", "ip6",
     "'2001:db8::20/7': Proxmox takes a prefix length of 8 to 128"),
    ("ip-short-prefix", "ip: 10.0.0.5/7", "", "ip",
     "'10.0.0.5/7': Proxmox takes a prefix length of 8 to 32"),
    ("ip6-zone", "ip: none\nip6: fe80::20%eth0/64", "", "ip6",
     "'fe80::20%eth0/64' is not 'auto' (SLAAC), 'dhcp' (DHCPv6) or an IPv6 address with prefix like 2001:db8::20/64"),
    ("ip6-manual", "ip: none\nip6: manual", "", "ip6",
     "'manual' is not 'auto' (SLAAC), 'dhcp' (DHCPv6) or an IPv6 address with prefix"),
    ("no-address-at-all", "ip: none", "", "",
     "ip is none and no ip6 is given: the container would have no address"),
    ("gateway-without-ip", "ip: none\ngateway: 192.0.2.1\nip6: 2001:db8::20/64", "", "",
     "gateway is set but ip is none"),
]


@pytest.mark.parametrize("name, network, ssh, key, message", REFUSED, ids=[case[0] for case in REFUSED])
def test_each_wrong_form_is_one_line_naming_the_key(tmp_path: Path, name: str, network: str, ssh: str, key: str,
                                                    message: str) -> None:
    problems = refused(tmp_path, network, ssh)
    where = "hosts[0].container.network" + (f".{key}" if key else "")
    assert len(problems) == 1 and "\n" not in problems[0], problems
    assert problems[0].startswith(f"{where}: {message}"), problems
    assert re.search(r"\(line \d+\)$", problems[0]), problems


@pytest.mark.parametrize("key, value", [("ip", "2001:db8::20/64"), ("ip6", "192.0.2.20/24"), ("ip", "10.0.0.5/7"),
                                        ("ip6", "2001:db8::20/7"), ("ip6", "fe80::20%eth0/64"),
                                        ("gw", "2001:db8::1"), ("gw6", "192.0.2.1")])
def test_what_gpunode_refuses_for_the_format_proxmox_refuses_too(key: str, value: str) -> None:
    """The refusals above that are Proxmox's own, not gpunode's: the value fails Proxmox's format."""
    assert not NET_FORMATS[key](value)


def test_without_a_static_address_the_node_needs_ssh_address(tmp_path: Path) -> None:
    problems = refused(tmp_path, "ip: dhcp\nip6: auto")
    assert len(problems) == 1
    assert problems[0].startswith("hosts[0]: container.network ip is dhcp and ip6 is auto: give container.ssh.address "
                                  "so the node can be reached"), problems


def test_an_ipv6_only_node_is_reached_at_its_literal(tmp_path: Path) -> None:
    """ssh takes user@2001:db8::20 (the port goes in -p), Ansible's ansible_host the bare literal."""
    host = loaded(tmp_path, "ip: none\nip6: 2001:db8::20/64\ngateway6: 2001:db8::1")
    reach = host.container.reach
    argv = engine.ssh_base(reach)
    assert argv[-2:] == ["--", "root@2001:db8::20"]
    assert "-p22" in argv
    gpu_nodes = inventory.build(hostfile.HostFile(version=1, hosts=[host]))["all"]["children"]["gpu_nodes"]["hosts"]
    assert gpu_nodes[derive.node_name(host)]["ansible_host"] == "2001:db8::20"


def test_two_containers_on_one_ipv6_address_are_refused(tmp_path: Path) -> None:
    path = host_file(tmp_path, "ip: 192.0.2.20/24\ngateway: 192.0.2.1\nip6: 2001:db8::20/64")
    text = path.read_text()
    second = text[text.index("  - name: pve1"):].replace("name: pve1", "name: pve2").replace("vmid: 200", "vmid: 201")
    second = second.replace("hostname: glm5", "hostname: glm5-b").replace("ip: 192.0.2.20/24", "ip: 192.0.2.21/24")
    path.write_text(text + second)
    with pytest.raises(hostfile.HostFileError) as caught:
        hostfile.load(path)
    assert [problem.removeprefix(f"{path}: ").split(" (line")[0] for problem in caught.value.problems] == [
        "hosts[1].container.network.ip6: 2001:db8::20 repeats hosts[0]'s container address: give another"]


def test_validate_names_the_key_to_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the CLI: exit 2, one line on stderr, nothing written."""
    monkeypatch.setenv("GPUNODE_STATE_DIR", str(tmp_path / "state"))
    path = host_file(tmp_path, "ip: 2001:db8::20/64\ngateway: 2001:db8::1")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr  # ip and gateway, each its own line
    assert lines[0].startswith(f"error: {path}: hosts[0].container.network.ip: '2001:db8::20/64' is an IPv6 address: "
                               "give it as ip6")
    assert lines[1].startswith(f"error: {path}: hosts[0].container.network.gateway: '2001:db8::1' is an IPv6 "
                               "address: give it as gateway6")
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(("network", "message"), [
    ("ip: none\nip6: ff02::1/64", "'ff02::1/64' is a multicast address, not one the container can be reached at"),
    ("ip: none\nip6: ::/64", "'::/64' is an unspecified address"),
    ("ip: 224.0.0.9/8", "'224.0.0.9/8' is a multicast address"),
    ("ip: 192.0.2.20/24\ngateway: 192.0.2.20", "gateway 192.0.2.20 is the container's own address (ip)"),
    ("ip: none\nip6: 2001:db8::20/64\ngateway6: 2001:db8::20", "gateway6 2001:db8::20 is the container's own address"),
])
def test_addresses_no_node_can_be_reached_at_are_refused(tmp_path: Path, network: str, message: str) -> None:
    with pytest.raises(hostfile.HostFileError) as caught:
        hostfile.load(host_file(tmp_path, network))
    assert len(caught.value.problems) == 1 and message in caught.value.problems[0], caught.value.problems


FLEET = ROOT / "inventory" / "lab" / "fleet.yml"
LAB_NETWORK = "        ip: 10.0.3.14/24\n        gateway: 10.0.3.1\n"  # the fleet's first host


def ipv6_fleet(tmp_path: Path, bind: str) -> Path:
    """The lab fleet with its first node IPv6-only (reached at 2001:db8::10) and that server's bind."""
    text = FLEET.read_text()
    assert LAB_NETWORK in text and text.count("        address: 10.0.3.14\n") == 1
    text = text.replace(LAB_NETWORK, "        ip: none\n        ip6: 2001:db8::10/64\n", 1)
    text = text.replace("        address: 10.0.3.14\n", "        address: 2001:db8::10\n", 1)
    text = text.replace("      bind: 0.0.0.0                   # the router reaches it from another node",
                        f"      bind: '{bind}'", 1)
    path = tmp_path / "fleet.yml"
    path.write_text(text)
    return path


def test_an_ipv6_only_worker_must_listen_on_ipv6_and_is_reached_in_brackets(tmp_path: Path) -> None:
    with pytest.raises(hostfile.HostFileError) as caught:
        hostfile.load(ipv6_fleet(tmp_path, "0.0.0.0"))
    assert [problem.split(": ", 1)[1].split(" (line")[0] for problem in caught.value.problems] == [
        "hosts[0].server.bind: 0.0.0.0 listens on IPv4 only, and the router reaches pve-lab1's node at 2001:db8::10: "
        "bind '::'"]
    fleet = hostfile.load(ipv6_fleet(tmp_path, "::"))
    router = derive.derive_router(fleet)
    assert router is not None
    assert router.workers[0].url == "http://[2001:db8::10]:30000"
    assert router.url == "http://[2001:db8::10]:30080"  # the router runs on that node, bound to all
