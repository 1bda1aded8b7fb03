"""Prove a running SGLang server answers correctly (``gpunode smoke``): health, model list, a known
answer, reasoning on and off, a forced tool call, the same streamed, and a short bench_serving run.
``command.smoke`` is the entry point; ``checks`` (pure judging), ``client`` (HTTP), ``bench``
(command builder and runners) and ``report`` are its parts."""
