"""The lab's bridge (lxcbr0, 10.0.3.1/24) with forwarding and NAT, tagged iptables rules."""

from __future__ import annotations

import json
from pathlib import Path

from gpunode_lab.contract import BRIDGE, BRIDGE_CIDR, IPTABLES_COMMENT, LAB_SUBNET, Progress
from gpunode_lab.util import ok, run

def bridge_state() -> tuple[bool, bool, bool]:
    """(exists, has BRIDGE_CIDR, is up)."""
    proc = run(["ip", "-j", "addr", "show", "dev", BRIDGE], check=False)
    if proc.returncode != 0:
        return False, False, False
    try:
        info = json.loads(proc.stdout)[0]
    except (ValueError, IndexError):
        return False, False, False
    has_addr = any(a.get("family") == "inet" and f"{a.get('local')}/{a.get('prefixlen')}" == BRIDGE_CIDR
                   for a in info.get("addr_info", []))
    return True, has_addr, "UP" in info.get("flags", [])


def iptables_rules() -> list[tuple[str, list[str], list[str]]]:
    """(table, check/delete spec, insert spec) for each rule the lab needs."""
    tag = ["-m", "comment", "--comment", IPTABLES_COMMENT]
    masq = ["POSTROUTING", "-s", LAB_SUBNET, "!", "-o", BRIDGE, *tag, "-j", "MASQUERADE"]
    fwd_in = ["-i", BRIDGE, *tag, "-j", "ACCEPT"]
    fwd_out = ["-o", BRIDGE, *tag, "-j", "ACCEPT"]
    return [
        ("nat", masq, ["-A", *masq]),
        ("filter", ["FORWARD", *fwd_in], ["-I", "FORWARD", "1", *fwd_in]),
        ("filter", ["FORWARD", *fwd_out], ["-I", "FORWARD", "1", *fwd_out]),
    ]


def ensure_network(progress: Progress) -> bool:
    changed = False
    exists, has_addr, is_up = bridge_state()
    if not exists:
        run(["ip", "link", "add", BRIDGE, "type", "bridge"], what=f"creating bridge {BRIDGE}")
        changed = True
    if not has_addr:
        run(["ip", "addr", "add", BRIDGE_CIDR, "dev", BRIDGE], what=f"adding {BRIDGE_CIDR} to {BRIDGE}")
        changed = True
    if not is_up:
        run(["ip", "link", "set", BRIDGE, "up"], what=f"bringing {BRIDGE} up")
        changed = True
    fwd = Path("/proc/sys/net/ipv4/ip_forward")
    if fwd.read_text().strip() != "1":
        fwd.write_text("1\n")
        changed = True
    for table, spec, insert in iptables_rules():
        if not ok(["iptables", "-w", "-t", table, "-C", *spec]):
            run(["iptables", "-w", "-t", table, *insert], what=f"iptables -t {table} {' '.join(insert)}",
                 fix="is the iptables comment match available (xt_comment)?")
            changed = True
    progress(f"network: bridge {BRIDGE} {BRIDGE_CIDR}, forwarding and NAT "
             + ("set up" if changed else "in place"))
    return changed


def remove_network(progress: Progress) -> None:
    for table, spec, _ in iptables_rules():
        while ok(["iptables", "-w", "-t", table, "-C", *spec]):
            run(["iptables", "-w", "-t", table, "-D", *spec], what=f"removing iptables rule {' '.join(spec)}")
    if bridge_state()[0]:
        run(["ip", "link", "del", BRIDGE], what=f"deleting bridge {BRIDGE}")
    progress(f"network: iptables rules and bridge {BRIDGE} removed")
