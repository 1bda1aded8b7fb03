"""``python3 -m sglang.launch_server ...`` runs the fake server (gpunode_lab/standin/sglang_server.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sglang_server import main  # noqa: E402 - found through the path set just above

if __name__ == "__main__":
    main()
