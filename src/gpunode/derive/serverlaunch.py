"""Run an sglang entry module with the API key read from a file, given as one ``--api-key=KEY``.

gpunode writes this file and the key file into the server container before it starts, and the
container's command is ``python3 <this file> sglang.launch_server --flag=value ...``. Why not
sglang's own ways in: a command-line ``--api-key`` shows in ``docker inspect`` and
/proc/<pid>/cmdline, and sglang's ``--config`` reader turns each entry into two arguments,
``--api-key`` then the key (0.5.9 srt/server_args_config_parser.py ``_add_scalar_arg``, 0.5.23
srt/utils/server_args_config_parser.py, the same), so a key that begins with ``-`` is read as a
flag and the server refuses to start ("argument --api-key: expected one argument"). Here the key is
one argument in this process's ``sys.argv`` only, and the module runs as ``python3 -m`` would run it.

Standard library only: it runs in the server image, where gpunode is not installed.
"""

import json
import runpy
import sys

KEY_FILE = "/run/gpunode/sglang-api-key.json"  # {"api-key": KEY}, written by gpunode (mode 0400)


def launch_argv(module: str, args: list[str], key: str) -> list[str]:
    """``sys.argv`` for ``module``: its own arguments, then the key as a single ``--api-key=KEY``."""
    for arg in args:
        if arg == "--api-key" or arg.startswith("--api-key="):
            raise SystemExit("gpunode launch: the API key comes from " + KEY_FILE + ", never the command line")
    return [module, *args, "--api-key=" + key]


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: launch.py MODULE [ARGUMENT ...]")
    with open(KEY_FILE, encoding="utf-8") as handle:
        key = json.load(handle)["api-key"]
    sys.argv = launch_argv(sys.argv[1], sys.argv[2:], key)
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
