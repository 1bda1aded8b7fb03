"""The production ``restart(flag_overrides) -> url`` for ``gpunode bench --ab``: the serve code with
the host file's ``server.flags`` overridden.

``serve_restart(host, image_tag, docker_url, console)`` returns a callable that copies the host
with ``server.flags`` updated by the overrides (``{}`` gives the host file's own flags back), runs
``gpunode.serve.command.run_serve`` on it (``docker_run.ensure_server`` replaces the container when
its settings changed, then the readiness wait shows the startup phases), and returns the server's
URL as seen from the node. A server that does not become ready raises ``RestartFailed`` with the
diagnosis, which the A/B records as that value's failure.

The serve code (pydantic, docker, rich) is imported when the callable is made, not with this
package.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

FlagValue = str | int | float | bool | None


class RestartFailed(RuntimeError):
    """The server did not come back ready with the overridden flags."""


def overridden(host: Any, overrides: Mapping[str, FlagValue]) -> Any:
    """A copy of ``host`` whose server.flags carry ``overrides`` on top of the host file's own."""
    flags = {**host.server.flags, **overrides}
    return host.model_copy(update={"server": host.server.model_copy(update={"flags": flags})})


def serve_restart(host: Any, image_tag: str, docker_url: str | None, console: Any,
                  timeout_s: float | None = None, **serve_settings: Any) -> Callable[[dict[str, FlagValue]], str]:
    """``serve_settings``: run_serve's keywords for the node (gpunode.stagerun.node_serve_settings:
    the node's GPU hand-off, the lab's memlock), so a restart starts the server as the serve stage does."""
    from gpunode.serve import command as serve_command

    wait_s = serve_command.DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s

    def restart(overrides: dict[str, FlagValue]) -> str:
        target = overridden(host, overrides)
        outcome = serve_command.run_serve(target, image_tag, docker_url, console, wait_s, **serve_settings)
        if outcome.exit_code != serve_command.EXIT_OK:
            why = outcome.diagnosis.title if outcome.diagnosis else "; ".join(outcome.messages) or "not ready"
            raise RestartFailed(f"the server with {dict(overrides) or 'the host file flags'} did not become ready "
                                f"(exit {outcome.exit_code}): {why}")
        return f"http://{serve_command.probe_address(host.server.bind)}:{host.server.port}"

    return restart
