"""The stand-in SGLang server the lab ships (gpunode_lab/standin: its HTTP server and startup,
sglang_server.py, and ``python3 -m sglang.bench_serving``, bench_serving.py), as the tests run it:
``shim/`` holds a package named ``sglang`` whose ``launch_server`` and ``bench_serving`` modules run
them, so the real command lines work unchanged with ``PYTHONPATH=<standin>/shim``; process.py runs
the server as a local process (through held_socket_server.py, on a socket bound by the test), and
ports.py gives every test its ports."""

from gpunode_lab.contract import STANDIN

FAKES = STANDIN
SHIM = FAKES / "shim"
SERVER = FAKES / "sglang_server.py"
BENCH = FAKES / "bench_serving.py"
