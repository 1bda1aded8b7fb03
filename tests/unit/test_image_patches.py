"""Parsing the image's patches, checking they apply, and checking they were applied."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode.derive.imagecontext import images_dir
from gpunode.catalogue.patches import PatchFormatError, applies, blocks_present, parse_patch

AUTOTUNE = "0001-flashinfer-autotune-cutlass.patch"
RUNNER = "sglang/srt/model_executor/model_runner.py"
# The lines of sglang 0.5.9's model_runner.py around the patched list, as the wheel ships them.
RUNNER_0_5_9 = '''    def _should_run_flashinfer_autotune(self) -> bool:
        """Check if flashinfer autotune should be run."""
        if self.server_args.disable_flashinfer_autotune:
            return False

        backend_str = self.server_args.moe_runner_backend

        # TODO smor- support other cases for flashinfer autotune, such as, mamba backend

        if backend_str not in [
            "flashinfer_trtllm",
            "flashinfer_mxfp4",
            # TODO: flashinfer_cutlass will cause some flashinfer compilation errors. To be fixed.
            # "flashinfer_cutlass",
        ]:
            return False

        major, _ = torch.cuda.get_device_capability()
'''


def autotune_text() -> str:
    return (images_dir() / "stacks" / "sglang-0.5.9-cu128" / "patches" / AUTOTUNE).read_text()


def tree_with(tmp_path: Path, text: str) -> Path:
    target = tmp_path / RUNNER
    target.parent.mkdir(parents=True)
    target.write_text(text)
    return tmp_path


def test_autotune_patch_targets_model_runner() -> None:
    patch = parse_patch(AUTOTUNE, autotune_text())
    assert list(patch.added_blocks) == [RUNNER]
    assert ['            "flashinfer_cutlass",'] in [block[-1:] for block in patch.added_blocks[RUNNER]]


def test_autotune_patch_applies_to_the_0_5_9_text(tmp_path: Path) -> None:
    ok, detail = applies(parse_patch(AUTOTUNE, autotune_text()), tree_with(tmp_path, RUNNER_0_5_9))
    assert ok, detail


def test_patch_that_no_longer_applies_names_itself(tmp_path: Path) -> None:
    moved_on = RUNNER_0_5_9.replace('            # "flashinfer_cutlass",\n', '            "flashinfer_cutedsl",\n')
    ok, detail = applies(parse_patch(AUTOTUNE, autotune_text()), tree_with(tmp_path, moved_on))
    assert not ok
    assert detail.startswith(f"patch {AUTOTUNE} does not apply")


def test_blocks_present_before_and_after_patching(tmp_path: Path) -> None:
    import subprocess

    patch = parse_patch(AUTOTUNE, autotune_text())
    root = tree_with(tmp_path, RUNNER_0_5_9)
    assert not blocks_present(patch.added_blocks[RUNNER], RUNNER_0_5_9)
    subprocess.run(["patch", "-p1", "--batch", "-d", str(root)], input=patch.text, text=True, check=True,
                   capture_output=True)
    assert blocks_present(patch.added_blocks[RUNNER], (root / RUNNER).read_text())


def test_commented_line_does_not_count_as_the_added_line() -> None:
    # The added line is a substring of the commented one: matching must be by whole lines.
    assert not blocks_present([['            "flashinfer_cutlass",']], RUNNER_0_5_9)


def test_blocks_must_be_consecutive() -> None:
    assert blocks_present([["a", "b"]], "x\na\nb\ny\n")
    assert not blocks_present([["a", "b"]], "a\nx\nb\n")


def test_description_before_the_diff_is_ignored() -> None:
    patch = parse_patch("p", "Why: because.\n+++ not a header\n\n--- a/m.py\n+++ b/m.py\n@@ -1 +1,2 @@\n a\n+b\n+c\n")
    assert patch.added_blocks == {"m.py": [["b", "c"]]}


def test_not_a_diff_is_refused() -> None:
    with pytest.raises(PatchFormatError, match="not a unified diff"):
        parse_patch("notes.patch", "just words\n")
    with pytest.raises(PatchFormatError, match="adds no lines"):
        parse_patch("rm.patch", "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1 @@\n a\n-b\n")
