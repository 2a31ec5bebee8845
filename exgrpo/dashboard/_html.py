"""Self-contained HTML pieces: the page shell (inline CSS, a strict CSP, no external resource),
tables, and matplotlib figures embedded as base64 PNG."""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

# Nothing but this page may load anything: images only from data: URIs, inline style/script only.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"

_CSS = """
body{font-family:system-ui,-apple-system,"DejaVu Sans",Arial,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{background:#14324b;color:#fff;padding:14px 28px}
header h1{margin:0 0 4px;font-size:22px} header .meta{font-size:13px;opacity:.85}
header a{color:#bfe0ff} header code{background:rgba(255,255,255,.16);color:#fff}
main{padding:8px 28px 40px;max-width:1500px}
section{background:#fff;border:1px solid #e2e2e2;border-radius:6px;margin:18px 0;padding:10px 18px 16px}
h2{font-size:18px;margin:8px 0 10px;color:#14324b}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:right;white-space:nowrap}
th{background:#eef3f7;text-align:center;white-space:normal;max-width:220px}
section{overflow-x:auto} td.l,th.l{text-align:left}
tr:nth-child(even) td{background:#fafcfe}
td.best{font-weight:bold;color:#0a6d2c} td.bad{color:#b00020} td.warn{color:#9a6700}
figure{margin:8px 0} figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:12px;color:#555;margin-top:2px}
.note{font-size:13px;color:#555} .err{color:#b00020;font-size:13px}
code{background:#f2f2f2;padding:1px 4px;border-radius:3px;font-size:12px}
dl.kv{display:grid;grid-template-columns:max-content auto;gap:2px 14px;font-size:13px;margin:4px 0}
dl.kv dt{font-weight:600} dl.kv dd{margin:0}
"""

# Marks every <img> with the size the browser decoded (data-natural-width) and the body with
# data-ready once the page has loaded: a headless browser's DOM dump shows the images really rendered.
_SCRIPT = """
(function(){function mark(){var n=0;document.querySelectorAll('img').forEach(function(i){
i.setAttribute('data-natural-width',String(i.naturalWidth));if(i.naturalWidth>0)n++;});
document.body.setAttribute('data-images-rendered',String(n));document.body.setAttribute('data-ready','1');}
if(document.readyState==='complete')mark();else window.addEventListener('load',mark);})();
"""


def esc(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def fmt(x: Any, digits: int = 4, sign: bool = False) -> str:
    """Numbers as fixed decimals (``—`` for None/NaN), anything else as text."""
    if x is None:
        return "—"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return f"{x:+d}" if sign else str(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            return "—"
        return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"
    return str(x)


def page(title: str, meta: Iterable[str], sections: Iterable[str], kind: str) -> str:
    """The whole document. ``meta``: already-escaped HTML fragments for the header line."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    meta_html = " · ".join([*meta, f"generated {now}"])
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
        "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
        f"<meta name=\"generator\" content=\"exgrpo dashboard\"><title>{esc(title)}</title>"
        f"<style>{_CSS}</style></head>\n<body data-report=\"{esc(kind)}\">\n"
        f"<header><h1>{esc(title)}</h1><div class=\"meta\">{meta_html}</div></header>\n<main>\n"
        + "\n".join(sections)
        + f"\n</main>\n<script>{_SCRIPT}</script>\n</body></html>\n"
    )


def section(sid: str, title: str, body: str) -> str:
    return f"<section id=\"{esc(sid)}\"><h2>{esc(title)}</h2>\n{body}\n</section>"


def link(url: str | None, text: str) -> str:
    return f"<a href=\"{esc(url)}\">{esc(text)}</a>" if url else esc(text)


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], tid: str | None = None,
          left: int = 1) -> str:
    """``rows`` hold complete ``<td ...>...</td>`` cells (see :func:`td`); the first ``left``
    header cells are left-aligned."""
    left_cls = ' class="l"'
    head = "".join(f"<th{left_cls if i < left else ''}>{esc(h)}</th>" for i, h in enumerate(headers))
    body = "\n".join("<tr>" + "".join(r) + "</tr>" for r in rows)
    tid_attr = f' id="{esc(tid)}"' if tid else ""
    return f"<table{tid_attr}><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>"


def td(content_html: str, cls: str | None = None, **data: Any) -> str:
    """A cell: ``content_html`` is already HTML; ``data`` become ``data-*`` attributes (``_`` -> ``-``)."""
    attrs = "".join(f" data-{k.replace('_', '-')}=\"{esc(v)}\"" for k, v in data.items() if v is not None)
    cls_attr = f' class="{cls}"' if cls else ""
    return f"<td{cls_attr}{attrs}>{content_html}</td>"


def kv(pairs: Iterable[tuple[str, str]]) -> str:
    """A definition list; values are already HTML."""
    return "<dl class=\"kv\">" + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


def new_figure(width: float, height: float):
    """A matplotlib Figure on the Agg canvas, without pyplot (no global backend state, thread-safe)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def figure_html(fig, fid: str, caption: str, alt: str | None = None, dpi: int = 100) -> str:
    """``<figure>`` with the figure as a base64 PNG data URI."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return (f"<figure id=\"{esc(fid)}\"><img alt=\"{esc(alt or caption)}\" src=\"data:image/png;base64,{data}\">"
            f"<figcaption>{esc(caption)}</figcaption></figure>")
