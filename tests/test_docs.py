"""The documentation: the README and the ``docs/`` site built by mkdocs (``mkdocs.yml``).

The site is built for real with ``mkdocs build --strict`` (any warning fails it: a page missing
from the nav or named there and absent, a link to a missing page or anchor); then every relative
link of the built HTML, and every link of the README, must reach a file that exists. User docs hold
no notes about the machine they were written on."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: Phrases that describe a build or test machine, not tgnb: none belongs in user docs.
MACHINE_NOTES = (
    "lies on disk",
    "CPU wheel",
    "these machines",
    "2-core",
    "wall time here",
    "the machine being shared",
)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if value is not None and key in ("href", "src"):
                self.links.append(value)
            if key == "id" and value:
                self.ids.add(value)


def _parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def test_the_site_builds_strictly_and_every_internal_link_resolves(tmp_path: Path) -> None:
    if shutil.which("mkdocs") is None and not _has_mkdocs():
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(site)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    # 404.html is served from any depth, so its links are absolute: not links between pages
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")
    assert len(pages) >= len(list(DOCS.glob("*.md")))
    broken = []
    for page in pages:
        for link in _parse(page).links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "#")):
                continue  # external, or this page's own anchor (mkdocs checked those)
            target = (page.parent / unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{page.relative_to(site)}: {link}")
            elif parts.fragment and parts.fragment not in _parse(target).ids:
                broken.append(f"{page.relative_to(site)}: {link} (no such anchor)")
    assert broken == []


def _has_mkdocs() -> bool:
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        return False
    return True


def test_every_readme_link_reaches_a_file() -> None:
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert any(link.startswith("docs/") for link in links)
    missing = [
        link
        for link in links
        if not urlsplit(link).scheme and not (ROOT / urlsplit(link).path).exists()
    ]
    assert missing == []


def test_user_docs_hold_no_notes_about_the_build_machine() -> None:
    for path in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        text = path.read_text().lower()
        found = [note for note in MACHINE_NOTES if note.lower() in text]
        assert found == [], f"{path.relative_to(ROOT)}: {found}"


def test_the_readme_is_short_and_says_where_the_sidebar_is() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 100
    assert "left sidebar" in text and "Together GPUs" in text


def test_the_readme_names_what_an_install_from_a_checkout_needs() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "Node.js >= 18" in text and "npm" in text


def test_the_user_guide_lists_the_extras_that_all_includes() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    included = re.fullmatch(r"tgnb\[(.*)\]", extras["all"][0])
    assert included is not None
    guide = " ".join((DOCS / "user-guide.md").read_text().split())
    assert "all but" not in guide
    for name in included.group(1).split(","):
        assert f"`{name}`" in guide, name
