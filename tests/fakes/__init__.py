"""Stand-ins for SGLang 0.5.9 used by the tests: its HTTP server and startup (sglang_server.py) and
``python3 -m sglang.bench_serving`` (bench_serving.py). ``shim/`` holds a package named ``sglang``
whose ``launch_server`` and ``bench_serving`` modules run them, so the real command lines work
unchanged with ``PYTHONPATH=tests/fakes/shim``."""

from pathlib import Path

FAKES = Path(__file__).resolve().parent
SHIM = FAKES / "shim"
SERVER = FAKES / "sglang_server.py"
BENCH = FAKES / "bench_serving.py"
