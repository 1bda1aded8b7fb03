"""One name per stage (ARCHITECTURE.md): each stage of gpunode.ground.stagelist is a play, a role, a package,
a check layer and a CLI verb of the same name, in the same order everywhere."""

from __future__ import annotations

import importlib

import pytest
import yaml

from gpunode.checks import CHECKS_DIR, LAYERS
from gpunode.ground.paths import COLLECTION, PLAYBOOKS
from gpunode.ground.stagelist import STAGE_NAMES

GPU_SIDE = ("image", "p2p", "serve", "smoke")


@pytest.mark.parametrize("name", STAGE_NAMES)
def test_the_stage_is_a_play_a_role_a_package_and_a_layer(name: str) -> None:
    play = yaml.safe_load((PLAYBOOKS / "stages" / f"{name}.yml").read_text())[0]
    assert play["tags"] == [name] and play["name"].startswith(f"{name}: ")
    assert [role["role"] for role in play["roles"]] == [f"gpunode.core.{name}"]
    assert (COLLECTION / "roles" / name / "tasks" / "main.yml").is_file()
    package = importlib.import_module(f"gpunode.stages.{name}")
    assert package.__file__ and package.__file__.endswith(f"gpunode/stages/{name}/__init__.py")
    if name in GPU_SIDE:
        assert callable(importlib.import_module(f"gpunode.stages.{name}.stage").run)
    assert (CHECKS_DIR / f"test_{name}.py").is_file()


def test_the_layers_are_the_stages_in_order() -> None:
    assert LAYERS == STAGE_NAMES
    assert sorted(p.stem.removeprefix("test_") for p in CHECKS_DIR.glob("test_*.py")) == sorted(STAGE_NAMES)


def test_every_stage_has_its_verb() -> None:
    from typer.main import get_command

    from gpunode.cli import app

    cli = get_command(app)
    commands = set(cli.commands)  # type: ignore[attr-defined]
    assert {name for name in STAGE_NAMES if name != "image"} <= commands
    assert "build" in cli.commands["image"].commands  # type: ignore[attr-defined]


def test_the_gpu_side_plays_hand_the_inventory_over_whole() -> None:
    """The seam: the host and its derived values cross once, as the inventory carries them."""
    for name in GPU_SIDE:
        play = yaml.safe_load((PLAYBOOKS / "stages" / f"{name}.yml").read_text())[0]
        assert play["roles"][0]["vars"][f"{name}_host"] == "{{ gpunode_host }}"
        assert play["roles"][0]["vars"][f"{name}_derived"] == "{{ gpunode_derived }}"
