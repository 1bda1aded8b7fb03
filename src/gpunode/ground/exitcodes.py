"""gpunode's exit codes: one number, one meaning, for every command (README "Exit codes" is this
table; a unit test holds the two equal, and each command's --help to its row).

Stdlib only: the p2p stage runs gpunode.stages.p2p inside the server image with this file beside it.
"""

from __future__ import annotations

OK = 0
FAILED = 1  # what was asked did not succeed: a stage, a check, a finding, a request
BAD_INPUT = 2  # the host file, the command line, a file given: nothing was contacted or changed
UNREACHABLE = 3  # a host, a node, its Docker engine or the Proxmox API did not answer
ENVIRONMENT = 4  # this machine cannot do it: Ansible, pytest, the GPU driver, CUDA, PyTorch missing or unusable
NOT_APPLICABLE = 5  # passed where it applies, and part did not apply: P2P with fewer than two GPUs
INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)

MEANING: dict[int, str] = {
    OK: "done: everything asked for passed",
    FAILED: "failed: a stage, check or finding failed (each is named)",
    BAD_INPUT: "bad input: host file, command line or a named file; nothing was contacted or changed",
    UNREACHABLE: "unreachable: a host, node, Docker engine or the Proxmox API did not answer",
    ENVIRONMENT: "environment: this machine lacks what the command needs (Ansible, pytest, GPU driver, CUDA)",
    NOT_APPLICABLE: "passed where it applies: part of the check did not apply (P2P with fewer than two GPUs)",
    INTERRUPTED: "interrupted",
}

# What each command can return: the codes above, said for that command.
COMMANDS: dict[str, dict[int, str]] = {
    "validate": {OK: "valid", BAD_INPUT: "bad input: not valid (every problem, one line each)"},
    "plan": {OK: "shown", FAILED: "--live: the API refused a read", BAD_INPUT: "bad host file, or a secret --live cannot read",
             UNREACHABLE: "--live: a Proxmox API unreachable"},
    "provision": {OK: "every selected stage converged", FAILED: "a stage failed on a host (each failed host, task "
                  "and message printed, other hosts went on)",
                  BAD_INPUT: "bad host file, stage or flag", UNREACHABLE: "a host unreachable, nothing else failed",
                  ENVIRONMENT: "Ansible could not run", INTERRUPTED: "interrupted"},
    "<stage> (host, container, node, image build, p2p, serve, smoke, router)": {
        OK: "the stage converged on every host", FAILED: "it failed", BAD_INPUT: "bad host file or flag",
        UNREACHABLE: "a host unreachable", ENVIRONMENT: "Ansible could not run", INTERRUPTED: "interrupted"},
    "check": {OK: "every check passed (pending ones wait for a reload or reboot)", FAILED: "a check failed",
              BAD_INPUT: "bad host file or layer", UNREACHABLE: "a host unreachable (its checks not run)",
              ENVIRONMENT: "no check could run (pytest or testinfra missing, nothing collected)",
              INTERRUPTED: "interrupted"},
    "p2p --local": {OK: "every GPU and pair met expectations", FAILED: "a pair or GPU below expectation, P2P "
                    "unavailable or wrong data", BAD_INPUT: "bad input", ENVIRONMENT: "no driver, NVML, GPU, CUDA or "
                    "PyTorch (cuInit error 3 names the HMM fix)", NOT_APPLICABLE: "passed with fewer than two GPUs "
                    "(pairs not applicable)"},
    "serve --local": {OK: "ready", FAILED: "not ready (diagnosed from its log)", BAD_INPUT: "bad input",
                      UNREACHABLE: "the Docker engine unreachable"},
    "smoke --local": {OK: "every check passed", FAILED: "a check failed or the server is not ready",
                      BAD_INPUT: "bad input", ENVIRONMENT: "the bench could not run"},
    "image build --local": {OK: "built or present", FAILED: "the build failed", BAD_INPUT: "bad input",
                            UNREACHABLE: "the engine unreachable"},
    "image verify": {OK: "every finding passed", FAILED: "a finding failed", BAD_INPUT: "bad input"},
    "bench": {OK: "ok", FAILED: "failed requests, or a level >10 % worse than the baseline", BAD_INPUT: "bad input",
              UNREACHABLE: "the node or its engine unreachable", ENVIRONMENT: "the bench could not run"},
    "diagnose": {OK: "every failure named, or none (a healthy log)", FAILED: "a failure no signature names",
                 BAD_INPUT: "no log, no such file, or a bad host file", UNREACHABLE: "the node or its server "
                 "container unreachable"},
    "lab up / down": {OK: "done", ENVIRONMENT: "the lab could not be built or taken down (one line says why)"},
}


def help_text(command: str) -> str:
    """The codes of one command, for its --help."""
    return "Exit codes: " + ", ".join(f"{code} {text}" for code, text in COMMANDS[command].items()) + "."
