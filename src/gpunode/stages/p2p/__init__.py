"""GPU topology and peer-to-peer bandwidth check (``gpunode p2p``, ``python3 -m gpunode.stages.p2p``).

Runs where the server runs (the GPU container, the server image) and says, with numbers and a
verdict, whether this node can serve with tensor parallelism across its GPUs. Needs only Python,
nvidia-ml-py, PyTorch (imported lazily), rich and PyYAML; no pydantic.

- ``topology``: NVML readings as dataclasses;
- ``measure``: copies through CUDA via PyTorch (bandwidth, latency, data verified);
- ``verdict``: readings + expectations -> findings, pair and node verdicts, exit code;
- ``report``: rich tables and matrices, JSON;
- ``command.run``: all of it, returning the exit code.
"""

from gpunode.stages.p2p.verdict import EXIT_CODES, Expectations

__all__ = ["EXIT_CODES", "Expectations"]
