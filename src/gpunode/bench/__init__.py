"""``gpunode bench``: a concurrency sweep of ``sglang.bench_serving`` against a running server, with
every GPU sampled through NVML while each level runs, a report (Markdown and PNG plots), a
comparison against an earlier result file, an A/B of one server flag, and a roofline line.

- ``sampler``: the NVML sampler thread (standard library and nvidia-ml-py only, so it runs in any
  image that has the driver's user space);
- ``summary``: samples -> per-level power/utilisation summary and its single most telling finding;
- ``sweep``: the levels, each a bench_serving run while the sampler runs, each a JSON line;
- ``roofline``: the single-stream decode ceiling and the all-reduce latency floor, with the arithmetic;
- ``compare``: a result file against an earlier one, and A/B variants side by side;
- ``report``: Markdown and the plots (matplotlib, the ``bench`` extra);
- ``command.bench``: all of it, returning the exit code.

Importing this package imports none of torch, matplotlib, pydantic or docker.
"""
