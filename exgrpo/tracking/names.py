"""MLflow-safe names of metrics and params (one rule for every writer: runs, steps, sync)."""

from __future__ import annotations

import re

_BAD = re.compile(r"[^/\w.\- :]")


def sanitize_metric_name(name: str) -> str:
    """MLflow-safe metric/param key: ``@`` -> ``_at_``, anything outside ``[/\\w.\\- :]``
    (parentheses, brackets, commas, ...) -> ``_``, runs of ``_`` collapsed, no trailing ``_``.

    >>> sanitize_metric_name("val/pass@k(16)")
    'val/pass_at_k_16'
    """
    out = _BAD.sub("_", name.replace("@", "_at_"))
    out = re.sub(r"_+", "_", out)
    return "/".join(part.strip("_") or "_" for part in out.split("/"))
