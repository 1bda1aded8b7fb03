"""Runs inside the sglang image: prints sglang's server argument parser as the stand-in's data.

    docker run --rm --network none <image> python3 -c "$(cat tests/fakes/dump_sglang_args.py)" > tests/fakes/sglang_0_5_9_args.json

The parser is the one prepare_server_args builds (0.5.9 server_args.py:5579-5592): argparse with
its prog (none in 0.5.9, which under ``python3 -m sglang.launch_server`` prints ``launch_server.py``;
``sglang serve`` in 0.5.23), and
ServerArgs.add_cli_args. Actions keep their order (the usage text follows it); choices held in a set
(whose order varies run to run) are sorted.
"""

import argparse
import inspect
import json
import re
import sys

import sglang
import sglang.srt.server_args as server_args_module
from sglang.srt.server_args import ServerArgs

TYPES = {int: "int", float: "float", str: "str", json.loads: "json"}

# prepare_server_args' own prog: none in 0.5.9 (argparse then prints launch_server.py under
# python3 -m sglang.launch_server), "sglang serve" in 0.5.23 (server_args.py:679).
named = re.search(r'ArgumentParser\(prog="([^"]+)"', inspect.getsource(server_args_module.prepare_server_args))
PROG = named[1] if named else "launch_server.py"
parser = argparse.ArgumentParser(prog=PROG)
ServerArgs.add_cli_args(parser)
actions = []
for action in parser._actions:
    if isinstance(action, argparse._HelpAction):
        continue
    choices = action.choices
    if choices is not None:
        choices = sorted(choices, key=str) if isinstance(choices, (set, frozenset)) else list(choices)
    kind = TYPES.get(action.type, getattr(action.type, "__name__", None)) if action.type is not None else None
    actions.append({"flags": list(action.option_strings), "dest": action.dest, "nargs": action.nargs, "type": kind,
                    "choices": choices, "takes_value": action.nargs != 0, "required": action.required})
print(json.dumps({"source": f"sglang {sglang.__version__} sglang/srt/server_args.py ServerArgs.add_cli_args, dumped "
                            "from the real parser by tests/fakes/dump_sglang_args.py",
                  "prog": PROG, "actions": actions}, indent=1, sort_keys=True))
