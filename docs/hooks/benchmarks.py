"""mkdocs hook: the Benchmarks section, one page per recorded result under benchmarks/results/.

Each Markdown file there becomes a page with its text as it is (`X.md` → benchmarks/X.md; a
folder's `results.md` → benchmarks/FOLDER/, with the folder's other files, charts shown and the
raw data linked; `README.md` → the section's index), and the nav gets a Benchmarks section that
lists them. Nothing is copied by hand: a result added there is on the next build's site.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
SECTION = "benchmarks"
NAV_TITLE = "Benchmarks"


def result_pages() -> dict[str, Path]:
    """{page's path in the docs: the result file}, the index first, then by name."""
    pages = {f"{SECTION}/index.md": RESULTS / "README.md"}
    for path in sorted(RESULTS.rglob("*.md")):
        rel = path.relative_to(RESULTS)
        if rel == Path("README.md"):
            continue
        if len(rel.parts) > 1:  # a folder's results: its page is the folder's index
            pages[f"{SECTION}/{rel.parent.as_posix()}/index.md"] = path
        else:
            pages[f"{SECTION}/{rel.as_posix()}"] = path
    return pages


def on_config(config: Any) -> Any:
    """Add the Benchmarks section to the nav: the index, then one entry per result."""
    entries: list[Any] = []
    for uri in result_pages():
        if uri == f"{SECTION}/index.md":
            entries.append(uri)
        else:
            title = uri.removeprefix(f"{SECTION}/").removesuffix(".md").removesuffix("/index")
            entries.append({title: uri})
    config.nav = [*(config.nav or []), {NAV_TITLE: entries}]
    return config


def on_files(files: Files, config: Any) -> Files:
    """Add each result as a page and the files beside a folder's results as static files."""
    for uri, path in result_pages().items():
        text = path.read_text(encoding="utf-8")
        if path.parent != RESULTS:
            text += attachments(path.parent, uri.rsplit("/", 1)[0], files, config)
        files.append(File.generated(config, uri, content=text))
    return files


def attachments(folder: Path, where: str, files: Files, config: Any) -> str:
    """Add the other files of a result's folder to the site; Markdown that shows the charts and
    links the rest, for the end of the folder's page."""
    charts, data = [], []
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.suffix == ".md":
            continue
        files.append(File.generated(config, f"{where}/{path.name}", abs_src_path=str(path)))
        if path.suffix == ".png":
            charts.append(f"![{path.name}]({path.name})")
        else:
            data.append(f"[{path.name}]({path.name})")
    text = "".join(f"\n\n{chart}" for chart in charts)
    if data:
        text += f"\n\nRecorded files: {', '.join(data)}.\n"
    return text
