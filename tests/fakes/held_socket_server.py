"""The stand-in server (gpunode_lab/standin/sglang_server.py) on a socket its parent bound and handed
over (descriptor number in GPUNODE_TEST_SOCKET_FD): the port is the test's from the moment it is
picked, and no other process can take it before the server listens (tests/fakes/ports.py).

Everything else is the stand-in as shipped: its arguments, log and timings. It calls listen() where
it would have bound, after the "weights are loaded", so connections are refused until then, as before.
Run as ``python held_socket_server.py <stand-in arguments>``.
"""

from __future__ import annotations

import os
import socket
import sys

from gpunode_lab.contract import STANDIN

sys.path.insert(0, str(STANDIN))
import sglang_server  # noqa: E402 - found through the path set just above

FD_VARIABLE = "GPUNODE_TEST_SOCKET_FD"


class _OnHeldSocket(sglang_server._Server):
    held: socket.socket

    def server_bind(self) -> None:
        # Instead of binding a socket of its own (what TCPServer does), serve on the handed-over one.
        wanted = self.server_address[:2]
        bound = self.held.getsockname()[:2]
        if (wanted[0], int(wanted[1])) != (bound[0], int(bound[1])):
            raise SystemExit(f"held_socket_server: asked to serve on {wanted}, but the socket is bound to {bound}")
        self.socket.close()
        self.socket = self.held
        self.server_address = bound
        self.server_name, self.server_port = bound[0], int(bound[1])


def main() -> None:
    raw = os.environ.pop(FD_VARIABLE, "")
    if not raw.isdigit():
        raise SystemExit(f"held_socket_server: {FD_VARIABLE} must name an inherited socket, got {raw!r}")
    _OnHeldSocket.held = socket.socket(fileno=int(raw))
    sglang_server._Server = _OnHeldSocket  # start_http() looks the class up when it starts serving
    sglang_server.main()


if __name__ == "__main__":
    main()
