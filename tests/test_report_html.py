"""The rendered reports read well offline: each page has a real <title>, and none loads
a script, stylesheet or anything else from another site (nbconvert's default page
fetches require.js and MathJax from a CDN). Checked on the committed reports/html and
on a tiny notebook through the same exporter, so a regression in the exporter fails
here without re-rendering the whole report."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from loopscope.render.report import export_html, page_title

ROOT = Path(__file__).resolve().parents[1]
RENDERED = sorted((ROOT / "reports" / "html").glob("*.html"))
TEMPLATES = sorted((ROOT / "reports").glob("*.ipynb"))
REMOTE = re.compile(r"^\s*(https?:)?//", re.IGNORECASE)  # http://, https://, //host/...
CSS_IMPORT = re.compile(r"@import\s+(url\()?\s*['\"]?\s*(https?:)?//", re.IGNORECASE)
# A 1x1 PNG, as matplotlib's inline backend embeds figures.
PIXEL = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)).decode()


class _Loads(HTMLParser):
    """Collects what a browser would fetch while loading a page (not the links it
    merely shows), and the page's title."""

    def __init__(self) -> None:
        super().__init__()
        self.remote: list[str] = []
        self.titles: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        fetched = {"script": "src", "img": "src", "iframe": "src", "embed": "src",
                   "source": "src", "audio": "src", "video": "src", "object": "data"}
        if tag in fetched and REMOTE.match(a.get(fetched[tag], "")):
            self.remote.append(f"<{tag} {fetched[tag]}={a[fetched[tag]]}>")
        # <link rel=stylesheet|preload|modulepreload|icon ...>: all fetched; only an
        # <a href> is a link the reader chooses to follow.
        if tag == "link" and REMOTE.match(a.get("href", "")):
            self.remote.append(f"<link rel={a.get('rel')} href={a['href']}>")
        self._in = tag if tag in ("title", "style", "script") else None

    def handle_endtag(self, tag: str) -> None:
        self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "title":
            self.titles.append(data)
        elif self._in == "style" and CSS_IMPORT.search(data):
            self.remote.append(f"<style> {CSS_IMPORT.search(data).group(0)}")
        elif self._in == "script" and re.search(r"import\(\s*['\"](https?:)?//", data):
            self.remote.append("<script> import() from another site")


def loads(html: str) -> _Loads:
    """The page parsed: .remote (what it would fetch from another site), .titles."""
    parser = _Loads()
    parser.feed(html)
    return parser


def tiny_report(alt: str | None = "A figure of one pixel") -> nbformat.NotebookNode:
    """A notebook shaped like an executed report: a heading, a link in markdown, a
    figure (image/png, with its alt text as figures.show gives it), a table
    (text/html) and printed text."""
    meta = {"image/png": {"alt": alt}} if alt is not None else {}
    code = new_code_cell("show(fig); display(df)", outputs=[
        new_output("display_data", data={"image/png": PIXEL, "text/plain": "<Figure>"},
                   metadata=meta),
        new_output("display_data", data={"text/html": "<table><tr><td>1</td></tr></table>",
                                          "text/plain": "   a\n0  1"}),
        new_output("stream", name="stdout", text="done\n")])
    return new_notebook(cells=[
        new_markdown_cell("# A *tiny* report: [loopscope](https://example.org/loopscope)\n\n"
                          "Text with a link to [a paper](https://arxiv.org/abs/0000.00000)."),
        code])


def test_the_checker_sees_what_nbconvert_used_to_load():
    """nbconvert's default page (its require.js and MathJax from cdnjs) and a remote
    stylesheet fail the check; the markdown's links, which nothing fetches, do not."""
    old = ('<html><head><title>Notebook</title>'
           '<script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.1.10/require.min.js">'
           '</script><link rel="stylesheet" href="http://example.org/a.css">'
           '<style>@import url("https://fonts.example/x.css");</style></head>'
           '<body><a href="https://arxiv.org">paper</a></body></html>')
    found = loads(old)
    assert len(found.remote) == 3, found.remote
    assert found.titles == ["Notebook"]


def test_the_exporter_writes_a_titled_page_that_loads_nothing_remote():
    html = export_html(tiny_report())
    page = loads(html)
    assert page.remote == []
    assert page.titles == ["A tiny report: loopscope"]
    assert "<script" not in html  # no require.js, MathJax, mermaid or widget loader at all
    assert 'src="data:image/png;base64,' in html  # the figure is inline
    assert 'alt="A figure of one pixel"' in html
    assert 'href="https://arxiv.org/abs/0000.00000"' in html  # links stay links


def test_a_figure_without_alt_text_fails_the_page():
    with pytest.raises(ValueError, match="a figure has no alt text"):
        export_html(tiny_report(alt=None))


def test_show_displays_a_png_with_its_alt_text(monkeypatch):
    """figures.show hands IPython an image carrying the alt text in its metadata, which
    the page's template writes into the <img> tag."""
    import matplotlib.pyplot as plt

    from loopscope.render import figures
    shown = []
    monkeypatch.setattr(figures, "display", shown.append)
    fig, _ = plt.subplots()
    figures.show(figures.Drawn(fig, "an empty axis"))
    data, meta = shown[0]._repr_png_()
    assert data and meta["alt"] == "an empty axis"
    assert fig.number not in plt.get_fignums()  # closed: inline shows it no second time


def test_the_title_is_the_metadata_title_else_the_first_heading():
    nb = tiny_report()
    nb.metadata["title"] = "Set by hand"
    assert page_title(nb) == "Set by hand"
    nb = new_notebook(cells=[new_markdown_cell("Intro, no heading\n\n## A section"),
                             new_markdown_cell("# `loopscope`: the **first** H1\n# second")])
    assert page_title(nb) == "loopscope: the first H1"
    with pytest.raises(ValueError, match="no title"):
        page_title(new_notebook(cells=[new_markdown_cell("## only a section")]))


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.stem)
def test_every_report_template_has_a_title(template):
    """Checked before a report runs, so a missing heading fails in a second, not after
    minutes of execution; and it is neither nbconvert's "Notebook" nor the file name."""
    title = page_title(nbformat.read(template, as_version=4))
    assert title not in ("Notebook", template.stem) and len(title) > 10


@pytest.mark.committed
@pytest.mark.parametrize("page", RENDERED, ids=lambda p: p.name)
def test_committed_reports_load_nothing_remote_and_have_a_title(page):
    """The committed pages (re-rendered by `dvc repro`): they pass once rendered by the
    exporter above."""
    found = loads(page.read_text(encoding="utf-8"))
    assert found.remote == [], f"{page.name} loads from other sites: {found.remote}"
    assert len(found.titles) == 1
    assert found.titles[0].strip() not in ("", "Notebook", page.stem)
