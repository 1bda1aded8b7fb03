"""Why a Proxmox API request failed, by cause rather than by status code.

Proxmox answers most deterministic refusals with HTTP 500 (any ``die`` in an API handler), so the
status alone cannot say whether a retry may help: ``Device /dev/nvidia0 does not exist`` fails
the same way every time, ``can't lock file ... - got timeout`` may not. Each rule below names the
Proxmox source it follows; a message no rule knows is final unless its status is one of the
transient ones (a proxy in between, or pveproxy's own connection errors).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["refused", "transient"]


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    kind: Kind
    fix: str
    source: str  # the Proxmox file and function (and line) the message comes from


def _rule(pattern: str, kind: Kind, fix: str, source: str) -> Rule:
    return Rule(re.compile(pattern, re.IGNORECASE), kind, fix, source)


HOST_STAGE_FIX = ("run the host stage (`gpunode provision --tags host`), which loads the NVIDIA driver and "
                  "creates the nodes at boot (nvidia-modprobe -u -c=0 for the nvidia-uvm pair)")
HOST_NODES_FIX = f"the Proxmox host lacks that device node: {HOST_STAGE_FIX}"

# Matched in order against the message and Proxmox's per-parameter errors; the first match wins.
RULES: tuple[Rule, ...] = (
    # -- refusals: the same request gets the same answer ----------------------------------------
    _rule(r"unable to hotplug \w+", "refused",
          "nothing of the change was written (Proxmox aborts the whole update on a failed hot-plug); fix what "
          "it names, or stop the container (`pct stop <vmid>`) and re-run: a stopped container takes the "
          "change at once, and --restart-container cannot help because the update fails before the restart",
          "pve-container src/PVE/LXC/Config.pm vmconfig_hotplug_pending (line 1632), "
          "src/PVE/API2/LXC/Config.pm update_vm (line 259: no config write on errors)"),
    _rule(r"Device \S+ does not exist", "refused", HOST_NODES_FIX,
          "pve-container src/PVE/LXC/Tools.pm get_device_mode_and_rdev (line 163)"),
    _rule(r"\S+ is not a device", "refused",
          "a file that is not a device node sits at that path on the Proxmox host: remove it, then run the "
          "host stage (`gpunode provision --tags host`)",
          "pve-container src/PVE/LXC/Tools.pm get_device_mode_and_rdev (line 165)"),
    _rule(r"Error accessing device", "refused", HOST_NODES_FIX,
          "pve-container src/PVE/LXC/Tools.pm get_device_mode_and_rdev (line 164)"),
    _rule(r"SSH public key validation error", "refused",
          "container.ssh_public_keys must hold OpenSSH public keys only, one per line (no comment lines, "
          "never a private key): `ssh-keygen -l -f <file>` checks each",
          "pve-common src/PVE/Tools.pm validate_ssh_public_keys (line 1118)"),
    _rule(r"only allowed for root@pam", "refused",
          "devN passthrough, bind mount points and the hookscript are root@pam only, an API token of root "
          "included: use auth.method password (a root@pam ticket) or auth.method local",
          "pve-container src/PVE/LXC.pm check_ct_modify_config_perm (line 1655)"),
    _rule(r"Permission check failed", "refused",
          "the API user lacks a privilege named above: grant it on the path, or use root@pam",
          "pve-common src/PVE/Exception.pm raise_perm_exc (line 58)"),
    _rule(r"\bCT is locked \(", "refused",
          "a task holds the container (backup, snapshot, migrate, ...): wait for it to finish, or clear a "
          "stale lock with `pct unlock <vmid>` on the host",
          "pve-guest-common src/PVE/AbstractConfig.pm check_lock (line 339)"),
    _rule(r"Parameter verification failed", "refused",
          "Proxmox refused the value named above: correct it in the host file",
          "pve-common src/PVE/Exception.pm raise_param_exc (line 88)"),
    # -- transient: another task holds a lock, the cluster is briefly without quorum -------------
    _rule(r"can't lock file '[^']*' - got timeout", "transient",
          "another task holds the container's config lock: wait for it to finish and re-run",
          "pve-common src/PVE/Tools.pm run_with_timeout (line 167) under lock_file_full (line 264)"),
    _rule(r"cfs-lock .* error|got lock request timeout", "transient",
          "the cluster filesystem lock was busy: wait and re-run; `pvecm status` shows the cluster's state",
          "pve-cluster src/PVE/Cluster.pm $cfs_lock (lines 628, 683)"),
    _rule(r"ipcc_send_rec\[\d+\] failed", "transient",
          "the cluster filesystem (pmxcfs) did not answer: `systemctl status pve-cluster` on the host, then re-run",
          "pve-cluster src/PVE/Cluster.pm &$ipcc_send_rec (lines 153, 163)"),
    _rule(r"no quorum", "transient",
          "the cluster has no quorum: bring the other nodes back (`pvecm status`), then re-run",
          "pve-cluster src/PVE/Cluster.pm check_cfs_quorum (line 129)"),
    _rule(r"detected modified configuration", "transient",
          "the config changed while gpunode read it: re-run",
          "pve-common src/PVE/Tools.pm assert_if_modified (line 872)"),
)

# pveproxy passes AnyEvent::HTTP's own statuses through when it cannot reach pvedaemon or another
# node (595 connect, 596 timeout or broken reply, 597 body; pve-http-server
# src/PVE/APIServer/AnyEvent.pm proxy_request, line 856); 502-504 come from a proxy in between.
TRANSIENT_STATUS = frozenset({502, 503, 504, 595, 596, 597})
TRANSIENT_FIX = "the API or a proxy in front of it was briefly unavailable: re-run"


@dataclass(frozen=True)
class Cause:
    kind: Kind
    fix: str | None
    source: str | None

    @property
    def retryable(self) -> bool:
        return self.kind == "transient"


def known(text: str) -> Rule | None:
    """The first rule whose pattern is in ``text``, if any."""
    return next((rule for rule in RULES if rule.pattern.search(text)), None)


def classify(status: int | None, text: str) -> Cause:
    """The cause of an answer with ``status`` and Proxmox's ``text`` (message and errors joined).

    ``status`` None is a request that got no answer (connection dropped, timed out): transient.
    """
    rule = known(text)
    if rule is not None:
        return Cause(rule.kind, rule.fix, rule.source)
    if status is None or status in TRANSIENT_STATUS:
        return Cause("transient", TRANSIENT_FIX if status else None, None)
    return Cause("refused", None, None)
