"""The stand-in SGLang server the lab runs where the real one needs a GPU: sglang_server.py (the
HTTP server and startup, with the real parsers' flag data sglang_<version>_args.json, dumped by
dump_sglang_args.py inside the real images), bench_serving.py, and shim/sglang, which makes the
real command lines (python3 -m sglang.launch_server ...) run them. Stdlib only: they run in a bare
Debian image (gpunode_lab.image) and as local processes in the tests."""
