"""Each fact has one place (ARCHITECTURE.md, "Where each fact lives"); the copies that must stay,
because YAML or a module's documentation cannot import Python, are read here and held to it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from gpunode.ground import exitcodes, nvidia
from gpunode.ground.paths import COLLECTION, IMAGES

ROOT = Path(__file__).resolve().parents[2]
ROLES = COLLECTION / "roles"


def defaults(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())


def module_doc(name: str) -> dict:
    tree = ast.parse((COLLECTION / "plugins" / "modules" / f"{name}.py").read_text())
    text = next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", "") == "DOCUMENTATION")
    return yaml.safe_load(text)["options"]


def test_the_role_copies_of_the_nvidia_facts_are_gpunode_nvidias() -> None:
    assert tuple(defaults("node")["node_control_nodes"]) == nvidia.CONTROL_NODES
    assert defaults("host")["host_driver_tree_root"] == nvidia.TREE_ROOT
    assert defaults("container")["container_driver_tree_root"] == nvidia.TREE_ROOT
    assert defaults("node")["node_driver_mount"] == nvidia.MOUNT_POINT
    assert defaults("node")["node_cdi_dir"] == nvidia.CDI_DIR and nvidia.CDI_SPEC_FILE.startswith(nvidia.CDI_DIR + "/")


def test_the_module_docs_defaults_are_gpunode_nvidias() -> None:
    assert module_doc("nvidia_driver_tree")["dest"]["default"] == nvidia.TREE_ROOT
    assert module_doc("pve_lxc_gpu")["driver_tree_root"]["default"] == nvidia.TREE_ROOT


def test_the_images_find_the_driver_where_it_is_mounted() -> None:
    """The server image and the stand-in's put the mounted tree on PATH and the loader's path."""
    from gpunode_lab.image import DOCKERFILE

    template = (IMAGES / "sglang" / "Dockerfile.j2").read_text()
    for text in (template, DOCKERFILE):
        mounts = set(re.findall(r"(/[\w/.-]+?)/(?:bin|lib64)\b", text)) & {nvidia.MOUNT_POINT, "/usr/local/nvidia"}
        assert mounts == {nvidia.MOUNT_POINT}


def test_the_host_layer_checks_the_files_the_host_role_writes() -> None:
    from gpunode.checks import test_host

    host = defaults("host")
    assert test_host.HMM_CONF == f"{host['host_modprobe_dir']}/{host['host_hmm_conf']}"
    assert test_host.NODES_UNIT == host["host_nodes_unit"]


def readme_exit_codes() -> dict[str, dict[int, str]]:
    """README "Exit codes": one row per command, `code` then the text, separated by "; "."""
    text = (ROOT / "README.md").read_text().split("### Exit codes", 1)[1]
    table = text[text.index("| command | exit codes |"):].split("\n\n", 1)[0]
    rows: dict[str, dict[int, str]] = {}
    for line in table.splitlines()[2:]:
        command, codes = [cell.strip() for cell in line.strip("|").split("|")]
        rows[command.strip("`")] = {int(part.split(" ", 1)[0]): part.split(" ", 1)[1]
                                    for part in codes.split("; ")}
    return rows


def test_the_readmes_exit_code_table_is_gpunode_exitcodes() -> None:
    assert readme_exit_codes() == exitcodes.COMMANDS


# What each code's row must say in every command that uses it (one of these), and the words that
# belong to one code alone and so may appear in no other code's row.
SAYS = {exitcodes.OK: ("valid", "shown", "converged", "passed", "met", "ready", "built", "ok", "done", "named"),
        exitcodes.FAILED: ("fail", "refused", "not ready", "below"),
        exitcodes.BAD_INPUT: ("bad",), exitcodes.UNREACHABLE: ("unreachable",),
        exitcodes.ENVIRONMENT: ("could not", "missing", "no "),
        exitcodes.NOT_APPLICABLE: ("not applicable",), exitcodes.INTERRUPTED: ("interrupted",)}
OWN_WORDS = {exitcodes.BAD_INPUT: "bad input", exitcodes.UNREACHABLE: "unreachable",
             exitcodes.NOT_APPLICABLE: "not applicable", exitcodes.INTERRUPTED: "interrupted"}


def test_every_code_has_its_words() -> None:
    assert set(SAYS) == set(exitcodes.MEANING)


@pytest.mark.parametrize("code", sorted(exitcodes.MEANING))
def test_each_code_means_one_thing_in_every_command(code: int) -> None:
    """A command may leave a code out, never use it for something else: 3 is always unreachable,
    5 always passed-where-it-applies; every code is used by some command and each of its rows says
    what the code means, with no word that is another code's own."""
    rows = {command: codes[code] for command, codes in exitcodes.COMMANDS.items() if code in codes}
    assert rows, f"no command returns {code}"
    for command, text in rows.items():
        assert any(word in text for word in SAYS[code]), (command, code, text)
        for other, word in OWN_WORDS.items():
            if other != code:
                assert word not in text, (command, code, text, f"says {word!r}, the meaning of {other}")