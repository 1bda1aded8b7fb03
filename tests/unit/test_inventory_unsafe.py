"""A host file's value never becomes code in Ansible: the inventory carries the host file's data as
!unsafe (gpunode.inventory.write), so a value holding Jinja is kept as text by a real ansible-core,
and the connection paths, which stay plain for testinfra, refuse template delimiters."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpunode import inventory
from gpunode.hostfile import HostFileError, load

ROOT = Path(__file__).resolve().parents[2]
LAB_HOST = ROOT / "inventory" / "lab" / "host.yml"
ANSIBLE = Path(sys.executable).parent / "ansible"


def test_jinja_in_a_value_reaches_ansible_as_text_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    attack = "{{ lookup('pipe', 'touch " + str(marker) + "') }}{{ 7 * 7 }}"
    data = yaml.safe_load(LAB_HOST.read_text())
    data["hosts"][0]["monitor"] = {"alerts": {"webhook": {"url": f"http://127.0.0.1:9/{attack}"}}}
    data["hosts"][0]["server"]["flags"]["--chat-template"] = attack
    path = tmp_path / "host.yml"
    path.write_text(yaml.safe_dump(data))
    inv = inventory.write(load(path), tmp_path / "inventory.yml")
    # The play's own template reads the data (as the roles do): Ansible renders it, not what it holds.
    result = subprocess.run(
        [str(ANSIBLE), "-i", str(inv), "localhost", "-m", "ansible.builtin.debug", "-a", json.dumps({"msg":
         "{{ hostvars['pve-lab-ct200'].gpunode_derived.monitor.alertmanager.receivers[0].webhook_configs[0].url }}"
         " {{ hostvars['pve-lab-ct200'].gpunode_derived.launch.argv | join(' ') }}"})],
        capture_output=True, text=True, timeout=120, env={**os.environ, "ANSIBLE_NOCOLOR": "1"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    said = json.loads(result.stdout.partition("=>")[2])["msg"]  # "localhost | SUCCESS => {...}"
    assert said.count(attack) == 2, said
    assert "49" not in said and not marker.exists()


def test_the_inventory_is_the_same_data_read_back(tmp_path: Path) -> None:
    """What Ansible reads (its YAML loader keeps the !unsafe tag) is exactly what build() made."""
    hostfile = load(LAB_HOST)
    inv = inventory.write(hostfile, tmp_path / "inventory.yml")
    loader = type("Loader", (yaml.SafeLoader,), {})
    loader.add_constructor("!unsafe", lambda loader_, node: loader_.construct_mapping(node, deep=True))
    assert yaml.load(inv.read_text(), Loader=loader) == inventory.build(hostfile)
    assert len(re.findall(r": !unsafe$", inv.read_text(), re.M)) == 2 * 3  # two machines, three data variables


@pytest.mark.parametrize("key", ["key_file", "known_hosts"])
@pytest.mark.parametrize("mark", ["{{", "{%", "{#"])
def test_a_connection_path_with_a_template_delimiter_is_refused(tmp_path: Path, key: str, mark: str) -> None:
    data = yaml.safe_load(LAB_HOST.read_text())
    data["hosts"][0]["ssh"][key] = f"/tmp/{mark} lookup('pipe', 'id') x"
    path = tmp_path / "host.yml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(HostFileError) as caught:
        load(path)
    assert any(f"hosts[0].ssh.{key}:" in line and "template delimiter" in line for line in caught.value.problems), \
        caught.value.problems
