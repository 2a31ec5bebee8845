"""The package's floors: no import cycle among exgrpo's modules, and docs/architecture.md draws the
floors as pyproject.toml's import-linter contract declares them (`make lint` checks the contract).

The import graph is grimp's, the one import-linter checks: every import statement, those inside
functions and under ``if TYPE_CHECKING:`` included."""

import re
from pathlib import Path

import grimp
from importlinter.api import read_configuration

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- floors:begin -->", "<!-- floors:end -->"


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    members = set(component)
    edges = [f"  {d['importer']}:{d['line_number']} imports {d['imported']}"
             for a in component for b in sorted(graph.find_modules_directly_imported_by(a) & members)
             for d in graph.get_import_details(importer=a, imported=b)]
    return f"{len(component)} modules: {', '.join(component)}\n" + "\n".join(edges)


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import():
    graph = grimp.ImportGraph()
    for name in ("pkg.a", "pkg.b", "pkg.c", "pkg.d"):
        graph.add_module(name)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.c")
    graph.add_import(importer="pkg.c", imported="pkg.a")
    graph.add_import(importer="pkg.c", imported="pkg.d")
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_no_import_cycle_among_exgrpo_modules():
    graph = grimp.build_graph("exgrpo", cache_dir=None)  # every import, in functions and TYPE_CHECKING too
    found = cycles(graph)
    assert not found, "import cycles (move the shared piece down a floor, docs/architecture.md):\n" + "\n".join(
        describe(graph, c) for c in found)


def contracts() -> list[dict]:
    return read_configuration(str(ROOT / "pyproject.toml"))["contracts_options"]


def layers() -> list[str]:
    """The layers of the floors contract as written, top first (``a | b``: independent siblings)."""
    (floors,) = [c for c in contracts() if c["type"] == "layers"]
    return [layer.strip() for layer in floors["layers"]]


def modules(layer: str) -> list[str]:
    return re.split(r"\s*[|:]\s*", layer)


def floors_table() -> str:
    rows = ["| floor | modules | siblings |", "|---|---|---|"]
    for n, layer in enumerate(layers(), 1):
        names = modules(layer)
        siblings = "" if len(names) == 1 else "may import each other" if ":" in layer else "independent"
        rows.append(f"| {n} | {', '.join(f'`{m}`' for m in names)} | {siblings} |")
    pairs = [" and ".join(f"`{m}`" for m in c["modules"]) for c in contracts() if c["type"] == "independence"]
    rows += ["", "Also independent (no import either way, even through other modules): " + "; ".join(pairs) + "."]
    return "\n".join(rows)


def test_the_architecture_page_draws_the_floors_of_the_contract():
    text = PAGE.read_text()
    assert BEGIN in text and END in text, f"{PAGE}: the floors table goes between {BEGIN} and {END}"
    drawn = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert drawn == floors_table(), f"{PAGE} is out of date with pyproject.toml; the table is now:\n{floors_table()}"


def test_the_architecture_page_has_a_paragraph_per_floor_in_order():
    headings = re.findall(r"^### (\d+)\. (.*)$", PAGE.read_text(), flags=re.M)
    assert [int(n) for n, _ in headings] == list(range(1, len(layers()) + 1)), "one '### N. ...' heading per floor"
    assert [re.findall(r"`([\w.]+)`", title) for _, title in headings] == [modules(layer) for layer in layers()], \
        "each floor's heading names its modules as the contract lists them"
