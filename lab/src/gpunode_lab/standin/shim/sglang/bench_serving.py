"""``python3 -m sglang.bench_serving ...`` runs the stand-in (tests/fakes/bench_serving.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_serving import main  # noqa: E402 - found through the path set just above

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
