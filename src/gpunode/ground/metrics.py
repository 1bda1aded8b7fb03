"""Prometheus metrics as SGLang's server and router expose them, read with the official parser
(prometheus_client's text-format parser): the samples of one metric, by the name a sample carries
(a counter's samples end in ``_total``, its family's name does not)."""

from __future__ import annotations


class MetricsUnreadable(ValueError):
    """The text is not Prometheus' exposition format."""


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Each sample of ``name`` in ``text``: its labels and its value (none: an empty list)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return [(dict(sample.labels), float(sample.value)) for family in text_string_to_metric_families(text)
                for sample in family.samples if sample.name == name]
    except ValueError as exc:
        raise MetricsUnreadable(f"not Prometheus' text format: {' '.join(str(exc).split())[:200]}") from None


def by_label(text: str, name: str, label: str) -> dict[str, float]:
    """``name``'s values added up per value of ``label`` (e.g. the router's counts per worker)."""
    out: dict[str, float] = {}
    for labels, value in samples(text, name):
        key = labels.get(label)
        if key is not None:
            out[key] = out.get(key, 0.0) + value
    return out
