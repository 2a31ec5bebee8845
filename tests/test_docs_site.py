"""The documentation site: page references that lead nowhere fail the strict build (the hook
``scripts/docs_references.py``, for every page, generated ones included), and no name in inline code
breaks mid-word when a browser lays the pages out (Material breaks code anywhere in a narrow table
column unless ``docs/stylesheets/extra.css`` says otherwise)."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HOOK = ROOT / "scripts" / "docs_references.py"
WIDTHS = (1280, 800)
"""Viewport widths the pages are laid out at: a desktop, and a narrow window where columns shrink."""


def _hook():
    spec = importlib.util.spec_from_file_location("docs_references", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=300, cwd=config.parent, env=env)


def test_the_hook_finds_page_names_in_prose_dead_paths_in_code_and_invisible_characters():
    problems = _hook().problems
    exists = {"exgrpo/tracking/METRICS.md"}.__contains__
    assert problems("<p>the notebook's setting (notebook-toy.md).</p>", exists) == [
        "notebook-toy.md is named in plain text: link the page ([...](notebook-toy.md)) or, if it is not a page "
        "of this site, say what it is instead"]
    assert problems('<p>see <a href="../tiers/">tiers.md</a>; <code>exgrpo/tracking/METRICS.md</code>, the '
                    "artifact <code>comparison.md</code></p><pre><code>cat notes.md</code></pre>", exists) == []
    (dead,) = problems("<p><code>docs/nowhere.md</code></p>", exists)
    assert dead.startswith("`docs/nowhere.md` names no file")
    (soft,) = problems("<td><code>output_di\u00adr</code></td>", exists)
    assert soft.startswith("a soft hyphen (U+00AD) in 'output_di\\xadr'")


def test_a_page_citing_a_missing_page_fails_the_strict_build(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nThe toy's setting (notebook-toy.md).\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"site_name: t\nhooks:\n  - {HOOK}\n")
    built = _mkdocs(config, tmp_path / "site")
    assert built.returncode == 1, built.stderr
    assert "Doc file 'index.md': notebook-toy.md is named in plain text" in built.stderr
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nThe toy's setting ([tiers](tiers.md)).\n")
    assert _mkdocs(config, tmp_path / "site").returncode == 1  # a link to a missing page: MkDocs' own check
    (tmp_path / "docs" / "tiers.md").write_text("# Tiers\n")
    built = _mkdocs(config, tmp_path / "site")
    assert built.returncode == 0, built.stderr


def test_a_docstrings_docs_page_is_a_link_on_the_reference_page():
    from exgrpo.config.reference import _doc, field_name

    assert _doc("see docs/verl.md#vllm-rollouts-on-cpu.") == "see [docs/verl.md#vllm-rollouts-on-cpu](../verl.md#vllm-rollouts-on-cpu)."
    assert field_name("task.data_seed") == "<code>task.<wbr>data_seed</code>"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The project's site, built as `make docs` builds it (strict: any broken reference fails here)."""
    out = tmp_path_factory.mktemp("site")
    built = _mkdocs(ROOT / "mkdocs.yml", out)
    assert built.returncode == 0, built.stderr[-3000:]
    return out


MEASURE = """
function midWordBreaks(doc, page, width) {
  // every inline code element of the page's content that the layout wraps onto a second line
  // between two word characters: a name broken mid-word; and a default of the configuration
  // reference broken at a hyphen ("toy-" / "exgrpo")
  const found = [];
  for (const el of doc.querySelectorAll('.md-content code')) {
    if (el.closest('pre') || el.getClientRects().length < 2) continue;
    const whole = el.classList.contains('default');  // a config default: not even at a hyphen
    const walker = doc.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    let top = null, prev = '', node;
    while ((node = walker.nextNode())) {
      for (let i = 0; i < node.length; i++) {
        const range = doc.createRange();
        range.setStart(node, i); range.setEnd(node, i + 1);
        const rects = range.getClientRects();
        if (!rects.length) { prev = node.data[i]; continue; }  // e.g. a space collapsed at the end of a line
        const ch = node.data[i];
        const joined = /\\w/.test(prev) || (whole && prev === '-');
        if (top !== null && rects[0].top > top + 2 && joined && /\\w/.test(ch))
          found.push(page + ' @' + width + 'px: ' + JSON.stringify(el.textContent) + ' breaks between '
                     + JSON.stringify(prev) + ' and ' + JSON.stringify(ch));
        top = rects[0].top; prev = ch;
      }
    }
  }
  return found;
}
window.addEventListener('load', () => setTimeout(() => {
  const found = [];
  let pages = 0;
  for (const frame of document.querySelectorAll('iframe')) {
    const doc = frame.contentDocument;
    if (doc && doc.querySelector('.md-content')) pages++;
    found.push(...midWordBreaks(doc, frame.dataset.page, frame.dataset.width));
  }
  document.body.setAttribute('data-result', JSON.stringify({pages, found}));
}, 1000));
"""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.mark.slow  # a headless browser lays out every page
def test_no_name_in_inline_code_breaks_mid_word_in_a_browser(site, tmp_path):
    chromium = os.environ.get("EXGRPO_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.access(chromium, os.X_OK):
        if os.environ.get("EXGRPO_REQUIRE_BROWSER", "").strip().lower() not in ("", "0", "false", "no"):
            pytest.fail(f"EXGRPO_REQUIRE_BROWSER is set but chromium is not installed ({chromium}): "
                        "run scripts/setup-chromium.sh")
        pytest.skip("chromium not installed: run scripts/setup-chromium.sh")
    pages = sorted(str(p.relative_to(site)) for p in site.rglob("index.html"))
    frames = "".join(f'<iframe data-page="{p}" data-width="{w}" src="{p}" style="width:{w}px;height:900px"></iframe>'
                     for w in WIDTHS for p in pages)
    (site / "layout-check.html").write_text(f"<!doctype html><html><body>{frames}<script>{MEASURE}</script></body></html>")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path)
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
               "--disable-background-networking", "--disable-component-update", "--disable-dev-shm-usage",
               "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", f"--user-data-dir={profile}",
               "--virtual-time-budget=30000", "--dump-dom",
               f"http://127.0.0.1:{server.server_address[1]}/layout-check.html"]
        dom = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    finally:
        server.shutdown()
        server.server_close()
    assert dom.returncode == 0, dom.stderr[-3000:]
    start = dom.stdout.index('data-result="') + len('data-result="')
    import html

    result = json.loads(html.unescape(dom.stdout[start:dom.stdout.index('"', start)]))
    assert result["pages"] == len(pages) * len(WIDTHS) and len(pages) > 15
    assert result["found"] == []
