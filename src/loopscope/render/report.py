"""Reports: papermill executes a notebook template, nbconvert writes a self-contained
HTML page (titled, nothing loaded from another site, every figure with its alt text).
What a report was computed from its stage records before the notebook runs
(loopscope.base.provenance) and passes in as a parameter; the tables and numbers
the notebooks show are loopscope.render.report_tables (tables_a, tables_b), their figures
loopscope.render.figures (figures_a, figures_b); screenshots of the rendered pages are
loopscope.render.screenshots (no stage runs it)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import nbformat
import papermill as pm
from jupyter_client.manager import KernelManager
from nbconvert import HTMLExporter

from loopscope.base.files import atomic_write_bytes

# nbconvert's `lab` page with every block that loads a script from a CDN emptied:
# require.js (only widgets and old-style JS outputs need it; the reports have neither),
# MathJax (the reports write no LaTeX), mermaid.js (imported on demand from a CDN) and
# the widget manager. The reports then read the same offline as online, and opening one
# contacts no third party. Kept here, not in a template file, so that the report
# stages, which depend on this module, rerun when it changes.
OFFLINE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{% block data_png scoped %}
<div class="jp-RenderedImage jp-OutputArea-output {{ extra_class }}">
<img alt="{{ output.metadata.get('image/png', {}).get('alt', '') | escape_html }}" \
src="data:image/png;base64,{{ output.data['image/png'] | escape_html }}">
</div>
{% endblock data_png %}
"""
NO_ALT = "No description has been provided for this image"  # nbconvert's stand-in


def page_title(nb: nbformat.NotebookNode) -> str:
    """The HTML page's title: the notebook's `title` metadata, else its first level-1
    markdown heading, as plain text.

    nbconvert falls back to the notebook's file name, and for a notebook exported from
    memory to "Notebook": every report's browser tab, bookmark and history entry then
    read "Notebook". The heading is what the page says it is, so the title cannot drift
    from it."""
    if nb.metadata.get("title"):
        return str(nb.metadata["title"])
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            if line.startswith("# "):
                text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line[2:])  # [text](url) -> text
                return re.sub(r"[*`]", "", text).strip()
    raise ValueError("the report has no title: give its first markdown cell a '# heading' "
                     "(or set the notebook's metadata 'title').")


def export_html(nb: nbformat.NotebookNode) -> str:
    """nb as a self-contained HTML page: code and prompts hidden, titled by page_title,
    and no script or stylesheet fetched from another site (OFFLINE_TEMPLATE); figures
    are inline PNGs already, each with the alt text figures.show gave it (a figure
    without one fails the page: a reader of a screen reader or a text browser would
    get nbconvert's "No description" instead)."""
    exporter = HTMLExporter(raw_template=OFFLINE_TEMPLATE, exclude_input=True,
                            exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": page_title(nb)}})
    if NO_ALT in body or 'alt=""' in body:
        raise ValueError(f"{page_title(nb)}: a figure has no alt text; draw it through "
                         "loopscope.render.figures.show(figure, alt).")
    return body


def render(template: Path, html_out: Path, parameters: dict[str, Any], timeout_s: int) -> None:
    """Execute template with parameters and write the HTML (export_html) atomically.

    A failing notebook cell raises papermill's PapermillExecutionError and no HTML is
    written, so a broken report is never cached as a good one.
    """
    if not template.is_file():
        raise FileNotFoundError(f"{template}: report template not found.")
    page_title(nbformat.read(template, as_version=4))  # a missing title fails before running
    # The kernel inherits our environment; a non-inline MPLBACKEND would drop every figure.
    os.environ.pop("MPLBACKEND", None)
    with tempfile.TemporaryDirectory() as tmp:
        executed = Path(tmp) / template.name

        class LocalKernel(KernelManager):
            """The kernel talks over IPC sockets in our temporary folder: no TCP ports
            opened, and no 'running over TCP without encryption' warning."""

            def __init__(self, **kwargs: Any) -> None:
                super().__init__(transport="ipc", ip=str(Path(tmp) / "kernel"), **kwargs)

        pm.execute_notebook(str(template), str(executed), parameters=parameters,
                            kernel_name="python3", cwd=os.getcwd(), progress_bar=False,
                            execution_timeout=timeout_s, kernel_manager_class=LocalKernel)
        nb = nbformat.read(executed, as_version=4)
    body = export_html(nb)
    html_out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(html_out, body.encode())
