"""Reading recordings made before a change of meaning. A recording is evidence and stays as the
device printed it; what changed since is mapped here, once, for every test that reads one."""

from __future__ import annotations

from gpunode.ground import exitcodes

# The p2p check's exit codes as recorded on 2026-11-30 (tests/fixtures/p2p) -> what each means now:
# gpunode.ground.exitcodes gave each code one meaning on 2026-12-01 (the single-GPU pass was 3, is 5).
RECORDED_EXIT = {0: exitcodes.OK, 1: exitcodes.FAILED, 3: exitcodes.NOT_APPLICABLE}
