"""The production ``restart(flag_overrides) -> url`` for ``gpunode bench --ab``: the serve code with
the host file's ``server.flags`` overridden.

``serve_restart(host, image_tag, docker_url, console)`` returns a callable that copies the host
with ``server.flags`` updated by the overrides (``{}`` gives the host file's own flags back; an
``image.stack`` override starts that stack's image with its profile), runs
``gpunode.stages.serve.command.run_serve`` on it (``docker_run.ensure_server`` replaces the container when
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


STACK_KEY = "image.stack"


def overridden(host: Any, overrides: Mapping[str, FlagValue]) -> Any:
    """A copy of ``host`` whose server.flags carry ``overrides`` on top of the host file's own; an
    ``image.stack`` override swaps the stack, and the profile with it to that stack's own (the copy
    is validated again: that stack's driver minimum and the host file's flags must still fit)."""
    flags = {**host.server.flags, **{k: v for k, v in overrides.items() if k != STACK_KEY}}
    if STACK_KEY not in overrides:
        return host.model_copy(update={"server": host.server.model_copy(update={"flags": flags})})
    data = host.model_dump()
    data["image"]["stack"] = overrides[STACK_KEY]
    data["server"].update(flags=flags, profile=None)
    return type(host).model_validate(data)


def serve_restart(host: Any, image_tag: str, docker_url: str | None, console: Any,
                  timeout_s: float | None = None, **serve_settings: Any) -> Callable[[dict[str, FlagValue]], str]:
    """``serve_settings``: run_serve's keywords for the node (gpunode.stages.serve.stage.node_settings:
    the node's GPU hand-off, the lab's memlock), so a restart starts the server as the serve stage does."""
    from gpunode.stages.serve import command as serve_command

    wait_s = serve_command.DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s

    def restart(overrides: dict[str, FlagValue]) -> str:
        target = overridden(host, overrides)
        tag = image_tag
        if STACK_KEY in overrides:
            from gpunode.derive import server_image

            tag = server_image(target)  # that stack's image, built and shipped by its provision
        outcome = serve_command.run_serve(target, tag, docker_url, console, wait_s, **serve_settings)
        if outcome.exit_code != serve_command.EXIT_OK:
            why = outcome.diagnosis.title if outcome.diagnosis else "; ".join(outcome.messages) or "not ready"
            raise RestartFailed(f"the server with {dict(overrides) or 'the host file flags'} did not become ready "
                                f"(exit {outcome.exit_code}): {why}")
        return f"http://{serve_command.probe_address(host.server.bind)}:{host.server.port}"

    return restart
