"""The model stage where gpunode runs: the model tools' command (``python -m gpunode.stages.model``) on
the machine that holds the weights, over SSH, the request (and the Hub token) on its input; its
progress lines go to the runner's live line, its result becomes the record the node keeps for the
serve stage and ``gpunode check`` (/etc/gpunode/model.json).

The role installs the tools there first (a virtual environment with the hash-locked huggingface_hub
and safetensors: gpunode.core.model); the stage sends gpunode's model files beside them when they
differ from this gpunode's (``ship_tools``: one call compares them all, one tar sends them).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import subprocess
import tarfile
import threading
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpunode.derive.modelplan import ModelPlan
from gpunode.ground import exitcodes
from gpunode.ground.result import PROGRESS_ENV
from gpunode.hostfile import Ssh
from gpunode.stages.common import Reach, StageResult, Target
from gpunode.stages.engine import ssh_base

SSH_UNREACHABLE = 255  # ssh's own exit status when it could not connect
NOT_FOUND = 127  # env's status when the tools' interpreter is not there (yet)


def target_from_data(host: dict[str, Any], derived: dict[str, Any], api_key_file: str | None = None,
                     fabric: dict[str, Any] | None = None, hub_token_file: str | None = None) -> Target:
    if fabric:
        raise ValueError("a PCIe fabric is the p2p stage's, not the model stage's")
    target = Target.from_data(host, derived, api_key_file)
    if hub_token_file and target.host.model.token is not None:
        from gpunode.hostfile import SecretRef

        model = target.host.model.model_copy(update={"token": SecretRef(file=Path(hub_token_file))})
        target = Target(target.host.model_copy(update={"model": model}), target.derived)
    return target


def weights_machine(target: Target) -> Ssh:
    """Where the weights are: the Proxmox host (hub, host_path) or the GPU node (node_path)."""
    host = target.host
    return host.container.reach if target.derived.model.on == "node" else host.ssh


def reach(target: Target) -> Reach:
    """The machine that holds the weights; no Docker engine and no image (image=None)."""
    return Reach(weights_machine(target), (), None)


def tool_argv(plan: ModelPlan, verb: str) -> list[str]:
    """The tools' command: the virtual environment's interpreter without user site-packages."""
    return [f"{plan.tools_dir}/venv/bin/python", "-s", "-m", "gpunode.stages.model", verb]


def run_tool(ssh: Ssh, plan: ModelPlan, verb: str, request: dict[str, Any],
             on_line: Callable[[dict[str, Any]], None] = lambda line: None) -> tuple[int, list[dict[str, Any]], str]:
    """Run the tools' command there with ``request`` on its input; (exit status, its JSON lines, its stderr's end)."""
    lib = f"{plan.tools_dir}/lib"
    argv: list[str] = tool_argv(plan, verb)
    env: dict[str, str] | None = {**os.environ, "PYTHONPATH": lib}
    if ssh.connection != "local":
        # ssh hands the remote shell one string: every part quoted.
        argv = ssh_base(ssh) + [" ".join(shlex.quote(part) for part in ["env", f"PYTHONPATH={lib}", *argv])]
        env = None
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    # stderr drained beside stdout: left in its pipe, a long fetch's warnings would fill it and stall
    # the tools while this waits on stdout. What it said is kept for the failure message (the last lines).
    other: deque[str] = deque(maxlen=40)
    drain = threading.Thread(target=lambda: other.extend(line.rstrip() for line in proc.stderr), daemon=True)  # type: ignore[union-attr]
    drain.start()
    proc.stdin.write(json.dumps(request))
    proc.stdin.close()
    lines: list[dict[str, Any]] = []
    for raw in proc.stdout:
        try:
            line = json.loads(raw)
        except ValueError:
            continue  # not ours (a library's print): the result line is what counts
        if isinstance(line, dict):
            lines.append(line)
            on_line(line)
    code = proc.wait()
    drain.join()
    return code, lines, "\n".join(other)


def _gb(n: float) -> str:
    """Bytes the way a reader takes them in: GB for a checkpoint, MB or kB for a small one."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n / 1e3:.1f} kB"


def progress_line(line: dict[str, Any]) -> str | None:
    """``model: 12.30 / 450.00 GB, 1.21 GB/s, ETA 6m12s`` from a tool's progress line."""
    p = line.get("progress")
    if not isinstance(p, dict):
        return None
    eta = p.get("eta_s")
    eta_text = f"{int(eta) // 60}m{int(eta) % 60:02d}s" if isinstance(eta, (int, float)) else "?"
    return f"model: fetched {_gb(p.get('bytes', 0))} of {_gb(p.get('total', 0))}, {_gb(p.get('rate', 0))}/s, ETA {eta_text}"


def _progress_sink() -> Callable[[dict[str, Any]], None]:
    path = os.environ.get(PROGRESS_ENV)  # the runner's file, which it shows the last line of

    def sink(line: dict[str, Any]) -> None:
        text = progress_line(line)
        if text and path:
            with open(path, "a") as handle:
                handle.write(text + "\n")
    return sink


def record(plan: ModelPlan, result: dict[str, Any]) -> dict[str, Any]:
    """What the node keeps in /etc/gpunode/model.json: which revision, where, and whether it was
    proven whole (the serve stage refuses to start otherwise; ``gpunode check`` re-reads it). Not what
    this run fetched: that is the run's output, and kept here it would make the run after a fetch
    rewrite the record, so that a converged node would not read as unchanged."""
    verify = result.get("verify") or {}
    return {"ok": bool(verify.get("ok")), "source": plan.source, "repo": plan.repo, "revision": plan.revision,
            "weights_dir": plan.weights_dir, "mount_target": plan.mount_target, "level": verify.get("level"),
            "files": verify.get("files"), "bytes": verify.get("bytes"),
            "findings": [f"{f['code']} {f['subject']}: {f['message']}" for f in verify.get("findings", [])]}


def summary(plan: ModelPlan, where: str, result: dict[str, Any]) -> list[str]:
    verify = result.get("verify") or {}
    head = (f"{plan.repo}" + (f" at {plan.revision[:12]}" if plan.revision else "") +
            f" in {plan.weights_dir} on {where}: {verify.get('files', 0)} files, {_gb(verify.get('bytes') or 0)}")
    lines = []
    for f in verify.get("findings", []):
        lines.append(f"FAIL {f['code']} {f['subject']}: {f['message']}; fix: {f['fix']}")
    for code, count in (verify.get("more") or {}).items():
        lines.append(f"FAIL {code}: {count} more files")
    if result.get("would_fetch"):
        lines.append(f"would fetch {len(result['would_fetch'])} files: {', '.join(result['would_fetch'][:5])}")
    if result.get("fetched"):
        seconds = result.get("seconds") or 0
        rate = result.get("fetched_bytes", 0) / seconds if seconds else 0
        lines.append(f"fetched {len(result['fetched'])} files ({_gb(result.get('fetched_bytes', 0))}) in {seconds:.1f} s "
                     f"({_gb(rate)}/s)" + (f": {', '.join(result['fetched'][:5])}" if len(result["fetched"]) <= 5 else ""))
    hashed = f", {verify.get('hashed_files', 0)} hashed ({_gb(verify.get('hashed_bytes') or 0)})"
    if result.get("hashed_while_fetched"):
        hashed += f", {result['hashed_while_fetched']} hashed as fetched"
    state = "verified" if verify.get("ok") else "NOT verified"
    lines.append(f"{state} ({verify.get('level')}{hashed}): {head}")
    return lines[-1:] + lines[:-1] if verify.get("ok") else lines


TOOLS_SHIPPED_NOTE = "gpunode's model files"


def _on(ssh: Ssh, command: str, data: bytes, timeout_s: float = 120.0) -> subprocess.CompletedProcess[bytes]:
    """``command`` by the shell of the machine ``ssh`` reaches (this one, for a local connection), ``data`` on its input."""
    argv = ["sh", "-c", command] if ssh.connection == "local" else ssh_base(ssh) + [command]
    return subprocess.run(argv, input=data, capture_output=True, timeout=timeout_s)


def tools_archive(plan: ModelPlan) -> bytes:
    """gpunode's model files as one tar: each under its path below the tools' lib folder, with its folders."""
    data = io.BytesIO()
    folders: set[str] = set()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for source, rel in plan.tool_files:
            parts = rel.split("/")
            for depth in range(1, len(parts)):
                folder = "/".join(parts[:depth])
                if folder not in folders:
                    folders.add(folder)
                    info = tarfile.TarInfo(folder)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            content = Path(source).read_bytes()
            info = tarfile.TarInfo(rel)
            info.size, info.mode = len(content), 0o644
            tar.addfile(info, io.BytesIO(content))
    return data.getvalue()


def ship_tools(ssh: Ssh, plan: ModelPlan, check_mode: bool) -> bool | str:
    """gpunode's model files in the tools' lib folder there, as this gpunode has them. One call compares
    every file's sha256 there (``sha256sum -c``, the files named in a manifest made here); only when one
    differs or is missing is the whole set sent, one tar on the command's input (the p2p stage ships its
    package into the server image the same way). True: sent (in check mode: would be); False: as they
    were; a text: why they could not be read or sent (the machine did not answer)."""
    lib = shlex.quote(f"{plan.tools_dir}/lib")
    manifest = "".join(f"{hashlib.sha256(Path(source).read_bytes()).hexdigest()}  {rel}\n"
                       for source, rel in plan.tool_files)
    compared = _on(ssh, f"cd {lib} 2>/dev/null && sha256sum --status -c -", manifest.encode())
    if compared.returncode == 0:
        return False
    if compared.returncode == SSH_UNREACHABLE:
        return f"ssh to {ssh.user}@{ssh.address} failed: {' '.join(compared.stderr.decode(errors='replace').split())[-200:]}"
    if check_mode:
        return True
    sent = _on(ssh, f"mkdir -p {lib} && tar -x --no-same-owner -f - -C {lib}", tools_archive(plan))
    if sent.returncode != 0:
        return f"sending {TOOLS_SHIPPED_NOTE} failed (exit {sent.returncode}): " + \
            " ".join(sent.stderr.decode(errors="replace").split())[-200:]
    return True


def _token(target: Target) -> str | None:
    token = target.host.model.token
    return token.resolve() if token is not None else None


def _fail_text(lines: Iterable[dict[str, Any]], err: str, code: int) -> str:
    for line in lines:
        if "error" in line:
            return str(line["error"])
    return " ".join(err.split())[-300:] or f"the model tools exited {code}"


def run(target: Target, fw: Any, check_mode: bool) -> StageResult:
    plan = target.derived.model
    ssh = weights_machine(target)
    where = target.derived.name if plan.on == "host" else target.derived.node
    shipped = ship_tools(ssh, plan, check_mode)
    if isinstance(shipped, str):
        return StageResult(failed=True, unreachable=shipped.startswith("ssh to "), summary=[shipped])
    notes = ([f"model: {TOOLS_SHIPPED_NOTE} {'would be ' if check_mode else ''}updated in {plan.tools_dir}/lib on "
              f"{where}"] if shipped else [])
    request = {"plan": plan.model_dump(mode="json"), "token": _token(target), "check": check_mode}
    code, lines, err = run_tool(ssh, plan, "converge", request, _progress_sink())
    results = [line["result"] for line in lines if isinstance(line.get("result"), dict)]
    if code == SSH_UNREACHABLE and not lines:
        return StageResult(failed=True, unreachable=True,
                           summary=[f"ssh to {ssh.user}@{ssh.address} failed: {' '.join(err.split())[-200:]}"])
    if check_mode and code == NOT_FOUND and not lines:
        # The role's install tasks reported what they would do; nothing to verify with yet.
        return StageResult(changed=bool(shipped), summary=notes + [
            f"model: the tools are not on {where} yet: a real run installs them, then fetches what "
            f"{plan.weights_dir} lacks and verifies it"])
    if not results:
        text = _fail_text(lines, err, code)
        return StageResult(failed=True, unreachable=code == exitcodes.UNREACHABLE, summary=[text])
    result = results[-1]
    lines_out = notes + summary(plan, where, result)
    return StageResult(changed=bool(result.get("changed")) or bool(shipped), failed=code != exitcodes.OK,
                       summary=lines_out,
                       data={"record": record(plan, result), "fetched": result.get("fetched", [])})


RECORD = "/etc/gpunode/model.json"


def refusal(plan: ModelPlan, text: str | None) -> str | None:
    """Why the server must not start on the node's weights (its model record), or None: no record, a
    record of another revision or folder, or one whose verify failed, each named with its check."""
    fix = "run `gpunode provision --tags model`"
    if text is None:
        return f"the model stage has not verified the weights ({RECORD} is not on the node): {fix}"
    try:
        record = json.loads(text)
        seen = (record["repo"], record["revision"], record["weights_dir"])
    except (ValueError, KeyError, TypeError):
        return f"{RECORD} on the node is not the model stage's record: {fix}"
    if seen != (plan.repo, plan.revision, plan.weights_dir):
        return (f"the weights verified are {seen[0]} at {seen[1]} in {seen[2]}, the host file's are {plan.repo} at "
                f"{plan.revision} in {plan.weights_dir}: {fix}")
    if not record.get("ok"):
        found = "; ".join(str(f) for f in (record.get("findings") or [])[:3]) or "not verified"
        return f"the weights in {plan.weights_dir} are not whole: {found}: {fix}"
    return None


def stale_mount(plan: ModelPlan, vmid: int, links: int | None) -> str | None:
    """Why the node's weights are not the store's, though the record says verified: the folder was
    deleted (or replaced) on the Proxmox host while the container ran, and the bind mount still holds
    the deleted one, with no links and empty to the server. Only a new mount (a container restart)
    sees the store's folder again. None where there is no mount or it is live."""
    if plan.mount_source is None or links is None or links > 0:
        return None
    return (f"{plan.mount_target} on the node is a folder deleted on the Proxmox host since the container started "
            f"(its bind mount keeps the deleted one, not {plan.mount_source}): restart the container "
            f"(pct reboot {vmid} on the Proxmox host), then run `gpunode provision`")
