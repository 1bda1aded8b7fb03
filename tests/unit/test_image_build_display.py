"""How the build display reads Docker's stream, and what a failed build says."""

from __future__ import annotations

import io

from rich.console import Console

from gpunode.stages.image.build import BuildDisplay


def display() -> tuple[BuildDisplay, io.StringIO]:
    out = io.StringIO()
    return BuildDisplay(Console(file=out, width=200, force_terminal=False)), out


def test_steps_and_downloads_drive_the_bars() -> None:
    shown, out = display()
    with shown:
        shown.line("Step 3/9 : RUN pip install -r /opt/gpunode/requirements.lock")
        shown.line("Collecting torch==2.9.1")
        shown.line("  Downloading torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl (899.7 MB)")
        shown.line("Progress 1048576 of 943400000")
        steps = shown.progress.tasks[0]
        download = shown.progress.tasks[-1]
        assert (steps.completed, steps.total, steps.description) == (2, 9, "step 3/9")
        assert download.description.strip().startswith("torch-2.9.1-cp311")
        assert (download.completed, download.total) == (1048576, 943400000)
    text = out.getvalue()
    assert "Step 3/9" in text and "Downloading torch-2.9.1" in text
    assert "Progress 1048576" not in text  # progress lines feed the bar only
    assert "Collecting torch" not in text  # not a notable line


def test_failure_at_a_patch_step_names_the_patch() -> None:
    shown, _ = display()
    shown.line("Step 9/12 : COPY patches/0002-broken.patch /opt/gpunode/patches/0002-broken.patch")
    shown.line("Step 10/12 : RUN site=$(python3 -c '...') && if ! patch -p1 --dry-run < /opt/gpunode/patches/0002-broken.patch")
    shown.line("gpunode: patch 0002-broken.patch does not apply to the installed packages")
    message = shown.failure("The command '/bin/sh -c site=...' returned a non-zero code: 1")
    assert message.startswith("patch 0002-broken.patch does not apply: The command")
    assert "gpunode: patch 0002-broken.patch does not apply" in message


def test_failure_elsewhere_names_the_step() -> None:
    shown, _ = display()
    shown.line("Step 6/12 : RUN pip install --require-hashes -r /opt/gpunode/requirements.lock")
    shown.line("ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE.")
    message = shown.failure("returned a non-zero code: 1")
    assert message.startswith("build failed at Step 6/12 : RUN pip install")
    assert "DO NOT MATCH THE HASHES" in message
