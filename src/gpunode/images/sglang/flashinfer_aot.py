"""Runs INSIDE the image build: compiles FlashInfer modules ahead of time into its AOT directory.

Argument: a JSON list of ``{"name", "generator": "module:function", "kwargs"}`` (gpunode.image.aot;
a kwarg ``"dtype:<name>"`` is ``torch.<name>``). Each spec comes from FlashInfer's own generator;
FlashInfer 0.6.3 looks for ``<aot dir>/<name>/<name>.so`` before it compiles
(flashinfer/jit/core.py JitSpec.aot_path, build_and_load), so the built library is copied there.
The target arch comes from FLASHINFER_CUDA_ARCH_LIST (no GPU needed), the compiler from CUDA_HOME.
A spec whose name differs from the one gpunode computed stops the build: the list would be wrong.
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import time
from typing import Any


def spec_of(entry: dict[str, Any]) -> Any:
    import torch

    module, function = entry["generator"].split(":")
    kwargs = {key: getattr(torch, value[len("dtype:"):]) if isinstance(value, str) and value.startswith("dtype:")
              else value for key, value in entry["kwargs"].items()}
    return getattr(importlib.import_module(module), function)(**kwargs)


def main(entries: list[dict[str, Any]]) -> int:
    for entry in entries:
        spec = spec_of(entry)
        if spec.name != entry["name"]:
            print(f"gpunode: {entry['generator']} makes module {spec.name}, gpunode expected {entry['name']}",
                  file=sys.stderr)
            return 1
        started = time.monotonic()
        spec.build(verbose=False)
        spec.aot_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(spec.jit_library_path, spec.aot_path)
        print(f"gpunode: built {spec.name} ahead of time in {time.monotonic() - started:.0f} s "
              f"({spec.aot_path.stat().st_size} bytes, {len(spec.sources)} sources) -> {spec.aot_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
