"""A value never becomes an option or code: every argv gpunode builds from a host file puts a value
inside its own option argument (``--flag=value``, ``-oName=value``) or after ``--``, and a profile's
placeholders are filled by name from a fixed set, never evaluated."""

from __future__ import annotations

from pathlib import Path

from gpunode import derive, hostfile

from gpunode.stages import engine

from gpunode.catalogue import profiles
from gpunode.hostfile import Ssh

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventory" / "example" / "host.yml"


def test_ssh_puts_the_destination_after_double_dash_and_each_value_inside_its_option() -> None:
    ssh = Ssh(address="192.0.2.10", user="root", port=2222, key_file=Path("/k/id -x"), known_hosts=Path("/k/known"))
    argv = engine.ssh_base(ssh, "-nNT", "-L/tmp/s:/var/run/docker.sock")
    assert argv[-2:] == ["--", "root@192.0.2.10"]
    assert argv[:2] == ["ssh", "-p2222"] and "-i/k/id -x" in argv and "-oUserKnownHostsFile=/k/known" in argv
    # Nothing before "--" is a bare value an attacker could turn into an option of its own.
    options = argv[1:argv.index("--")]
    assert all(arg.startswith("-") for arg in options), options


def test_a_flag_value_that_starts_with_a_dash_stays_inside_its_flag() -> None:
    host = hostfile.load(EXAMPLE).hosts[0]
    odd = host.model_copy(update={"server": host.server.model_copy(update={
        "flags": {"--chat-template": "-oProxyCommand=touch /tmp/x", "--json-model-override-args": '{"a": 1}'}})})
    argv = derive.server_launch(odd).argv
    assert "--chat-template=-oProxyCommand=touch /tmp/x" in argv
    assert '--json-model-override-args={"a": 1}' in argv  # braces that are no placeholder stay as written
    assert all(arg.startswith("--") for arg in argv[3:]), argv


def test_placeholders_are_filled_by_name_and_nothing_is_evaluated() -> None:
    values = {"model_dir": "/model", "served_name": "glm-5", "bind": "127.0.0.1", "port": "30000"}
    assert profiles.fill("{model_dir}/x:{port}", values) == "/model/x:30000"
    for text in ("{model_dir.__class__.__mro__}", "{0}", "{}", "{port!r}", "{unknown}", "{{model_dir}}"):
        filled = profiles.fill(text, values)
        assert "class" not in filled or filled == text
    assert profiles.fill("{model_dir.__class__.__mro__}", values) == "{model_dir.__class__.__mro__}"
    assert profiles.fill("{{model_dir}}", values) == "{/model}"  # no format escapes: the name inside is filled


def test_commands_share_ansibles_connection_and_a_forward_has_its_own(tmp_path: Path) -> None:
    """A read on the node goes over the ControlPath gpunode's ansible.cfg names (the socket Ansible's
    tasks opened: no new handshake); a forward never does, since a master keeps a client's forwards."""
    from gpunode.ground.paths import control_path_dir

    ssh = Ssh(address="192.0.2.10", user="root", port=22)
    shared = engine.ssh_base(ssh)
    assert f"-oControlPath={control_path_dir()}/%C" in shared and "-oControlMaster=auto" in shared
    assert shared.index("-oControlMaster=auto") < shared.index("--")
    forward = engine.ssh_base(ssh, "-nNT", "-L/tmp/s:/var/run/docker.sock", shared=False)
    assert not any("Control" in arg for arg in forward), forward


def test_a_server_port_is_forwarded_from_where_its_bind_publishes_it(monkeypatch, tmp_path: Path) -> None:
    """Docker publishes a port on its bind address only: a server bound to the node's own address is
    not on the node's loopback, so serve's probe and smoke's requests go to that address (they were
    refused there before), a server bound to all to the loopback."""
    from gpunode.stages.common import Target
    from gpunode.stages.serve import stage as serve
    from gpunode.stages.smoke import stage as smoke

    host = hostfile.load(EXAMPLE).hosts[0]
    for bind, address in (("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "127.0.0.1"), ("192.0.2.10", "192.0.2.10"),
                          ("::", "[::1]"), ("2001:db8::20", "[2001:db8::20]")):
        changed = host.model_copy(update={"server": host.server.model_copy(update={"bind": bind})})
        for stage in (serve, smoke):
            assert stage.reach(Target.of(changed)).ports == ((address, changed.server.port),), (stage, bind)

    seen: list[list[str]] = []

    class Ssh_:
        def __init__(self, argv: list[str], **_: object) -> None:
            seen.append(argv)
            Path(next(a for a in argv if a.endswith("docker.sock"))[2:].split(":")[0]).touch()
            self.stderr = None

        def poll(self) -> None:
            return None

        def terminate(self) -> None:
            pass

        def wait(self, timeout: float) -> int:
            return 0

    monkeypatch.setattr(engine.subprocess, "Popen", Ssh_)
    ssh = Ssh(address="192.0.2.10", user="root", port=22)
    with engine.forward(ssh, (engine.served_at("192.0.2.10", 30000), 29000)) as fw:
        local = fw.ports[30000]
        assert fw.at(30000) == f"127.0.0.1:{local}"
    forwards = [a for a in seen[0] if a.startswith("-L127.0.0.1:")]
    assert forwards == [f"-L127.0.0.1:{local}:192.0.2.10:30000", f"-L127.0.0.1:{fw.ports[29000]}:127.0.0.1:29000"]
    local_engine = Ssh(address="192.0.2.10", connection="local")
    with engine.forward(local_engine, (engine.served_at("192.0.2.10", 30000),)) as fw:
        assert fw.at(30000) == "192.0.2.10:30000"  # this machine's own engine: the address itself
