"""Start SGLang's router with the API key read from a file, so that the key is on no command line.

sglang-router 0.3.2 takes its key only as ``--api-key`` (sglang_router/router_args.py, the
"Control Plane Authentication" group): the key the router demands of its clients and sends to its
workers. A command-line value would show in ``docker inspect`` and in /proc/<pid>/cmdline, so the
container runs this file with the router's other flags; it parses them with the router's own
parser (launch_router.parse_router_args), adds the key from KEY_FILE when that file exists, and
launches the router in this process (launch_router.launch_router). The key is one argument,
``--api-key=KEY``: as two, a key that begins with ``-`` would be read as a flag of its own.
"""

import os
import sys

from sglang_router.launch_router import launch_router, parse_router_args

KEY_FILE = "/run/gpunode/router-api-key"


def main() -> None:
    argv = sys.argv[1:]
    if any(arg == "--api-key" or arg.startswith("--api-key=") for arg in argv):
        sys.exit("gpunode router: the API key comes from " + KEY_FILE + ", never the command line")
    if os.path.exists(KEY_FILE):
        with open(KEY_FILE, encoding="utf-8") as handle:
            argv = argv + ["--api-key=" + handle.read().strip()]
    launch_router(parse_router_args(argv))


if __name__ == "__main__":
    main()
