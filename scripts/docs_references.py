"""MkDocs hook (mkdocs.yml ``hooks:``): page references that lead nowhere fail ``mkdocs build --strict``.

MkDocs checks links, not text. This hook reads every page as rendered (snippets included, the
generated configuration reference too) and warns, which ``--strict`` makes an error, about:

* a ``.md`` name in prose outside a link, e.g. "(notebook-toy.md)": a reader cannot follow it; a
  page is cited as a link, so MkDocs checks that it exists;
* a ``.md`` path (with a directory) in inline code that is neither a file of the repository nor a page
  of the site (a bare name in code may be an artifact's, e.g. ``comparison.md``);
* invisible characters that break or join words (soft hyphen, zero-width space and joiners): text
  pasted with them breaks names mid-word where no reader sees why.
"""

from __future__ import annotations

import logging
import re
from html.parser import HTMLParser
from pathlib import Path

log = logging.getLogger(f"mkdocs.plugins.{__name__}")

MD_NAME = re.compile(r"(?<![\w/.-])(?:[\w.-]+/)*[\w.-]+\.md(?![\w-])")
"""A Markdown file name or path, e.g. ``tiers.md`` or ``exgrpo/tracking/METRICS.md``."""
INVISIBLE = {"\u00ad": "soft hyphen", "\u200b": "zero-width space", "\u200c": "zero-width non-joiner",
             "\u200d": "zero-width joiner", "\u2060": "word joiner", "\ufeff": "zero-width no-break space"}


class _Text(HTMLParser):
    """The page's text, each piece with where it sits: prose, a link, inline code or a code block."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.pieces: list[tuple[str, str]] = []  # (where, text)

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in ("a", "code", "pre", "script", "style"):
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.open:
            del self.open[len(self.open) - 1 - self.open[::-1].index(tag):]

    def handle_data(self, data: str) -> None:
        where = ("block" if "pre" in self.open else "skip" if {"script", "style"} & set(self.open)
                 else "link" if "a" in self.open else "code" if "code" in self.open else "prose")
        self.pieces.append((where, data))


def problems(html: str, exists) -> list[str]:
    """What is wrong with the references of a rendered page. ``exists(path)``: whether a ``.md`` path
    in inline code names a file of the repository or a page of the site."""
    parser = _Text()
    parser.feed(html)
    parser.close()
    found: list[str] = []
    for where, text in parser.pieces:
        for ch, name in INVISIBLE.items():
            if ch in text and where != "skip":
                found.append(f"a {name} (U+{ord(ch):04X}) in {text.strip()[:60]!r}: delete it, it breaks the "
                             "word it sits in")
        if where == "prose":
            found += [f"{m} is named in plain text: link the page ([...]({m})) or, if it is not a page of this "
                      "site, say what it is instead" for m in MD_NAME.findall(text)]
        elif where == "code":
            found += [f"`{m}` names no file of the repository and no page of the site"
                      for m in MD_NAME.findall(text) if "/" in m and not exists(m)]
    return found


def on_page_content(html: str, page, config, files) -> str:
    docs = Path(config["docs_dir"])
    repo = Path(config["config_file_path"]).parent
    here = docs / Path(page.file.src_path).parent

    def exists(path: str) -> bool:
        return any((base / path).is_file() for base in (repo, docs, here))

    for problem in problems(html, exists):
        log.warning("Doc file '%s': %s", page.file.src_path, problem)
    return html
