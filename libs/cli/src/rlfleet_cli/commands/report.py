"""`rlfleet report RUN_DIR [--html] [--compare OTHER]`: the report of any run folder (an
`rlfleet rl` stage or an `rlfleet run` pipeline), and two runs side by side."""

from __future__ import annotations

import base64
import hashlib
import html
from pathlib import Path
from typing import Annotated

import typer

from rlfleet_cli.ui import fail, out


def report(
    run_dir: Annotated[
        Path, typer.Argument(help="A run folder: a stage (runs/<stage>) or a pipeline (--out).")
    ],
    as_html: Annotated[
        bool, typer.Option("--html", help="Also write a self-contained .html beside the .md.")
    ] = False,
    compare: Annotated[
        Path | None,
        typer.Option(
            "--compare",
            help="Another run folder: write RUN_DIR/compare.md with both runs side by side.",
        ),
    ] = None,
) -> None:
    """Write report.md (plots in plots/) for a run folder; with --compare also compare.md."""
    from rlfleet_pipeline.run_report import NotARunFolder, compare_runs, load_run, report_run

    try:
        run = load_run(run_dir)
    except NotARunFolder as exc:
        raise fail(f"RUN_DIR: {exc}") from None
    try:
        other = load_run(compare) if compare is not None else None
    except NotARunFolder as exc:
        raise fail(f"--compare: {exc}") from None
    written = [report_run(run)]
    if other is not None:
        written.append(compare_runs(run, other, run_dir))
    if as_html:
        written += [write_html(md) for md in list(written)]
    for path in written:
        out.print(str(path))


def write_html(markdown: Path) -> Path:
    """The markdown as one HTML file, plots inlined (data: URIs) so it can be mailed.

    Raw HTML in the markdown is shown as text, never interpreted (names from run files are
    already escaped as markdown, and `html: false` is the second wall), and the page's
    Content-Security-Policy lets it run no script and fetch nothing: only its own style
    and the inlined plots."""
    from markdown_it import MarkdownIt  # rich's own markdown parser

    parser = MarkdownIt("commonmark", {"html": False}).enable("table")
    body = parser.render(markdown.read_text())
    for png in sorted((markdown.parent / "plots").glob("*.png")):
        data = base64.b64encode(png.read_bytes()).decode()
        body = body.replace(
            f'src="{png.relative_to(markdown.parent)}"', f'src="data:image/png;base64,{data}"'
        )
    page = (
        '<!doctype html>\n<html><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{html.escape(markdown.stem)}: {html.escape(markdown.parent.name)}</title>"
        f"<style>{STYLE}</style></head><body>\n{body}</body></html>\n"
    )
    path = markdown.with_suffix(".html")
    path.write_text(page)
    return path


STYLE = (
    "body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em}"
    "td{text-align:right}td:first-child{text-align:left}img{max-width:100%}"
)
CSP = (
    "default-src 'none'; img-src data:; "
    f"style-src 'sha256-{base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()}'; "
    "base-uri 'none'; form-action 'none'"
)
"""No script, no request anywhere (a report may be opened from a mail or a shared
folder): only the inlined plots and the one style block, pinned by its hash."""
