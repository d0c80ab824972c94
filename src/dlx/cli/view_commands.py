"""`dlx view`: runs side by side in a browser, served on 127.0.0.1 or written as one self-contained HTML file."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

VIEW_HELP = """Show runs side by side in a browser: loss and bits per byte (train, validation, per source) against step,
tokens or wall-clock; lr, gradient norm, tokens/s, MFU, step phases and the bottleneck verdict; eval tasks; the
mixture per stage, requested against realised; events on the time axis and goodput; a `dlx tune` output's predicted
against measured step times; the runs' config differences. RUN is a run folder, a folder of runs (all of them), a
`dlx tune` OUT.json, or an s3://, gs://, hf:// URL of one. Serves the page on 127.0.0.1 (--port; a free one by
default) and follows running jobs live; from another machine, forward the port over SSH (ssh -L PORT:127.0.0.1:PORT
HOST). With --out FILE.html, writes one self-contained file to share instead (nothing in it is fetched from any host).
"""


def view(
    runs: Annotated[list[str], typer.Argument(help="Run folders, folders of runs, tune OUT.json files, or URLs.")],
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port on 127.0.0.1 (0: a free one).")] = 0,
    out: Annotated[Path | None, typer.Option(help="Write one self-contained HTML file instead of serving.")] = None,
    refresh: Annotated[float, typer.Option(min=0.2, help="Seconds between the page's reads of the runs.")] = 2.0,
    points: Annotated[
        int, typer.Option(min=100, help="Points per series: longer runs are drawn as min/max envelopes of buckets.")
    ] = 1000,
) -> None:
    from dlx.errors import UserError
    from dlx.view.page import write_page
    from dlx.view.payload import Viewer
    from dlx.view.server import serve

    viewer = Viewer(runs, points=points, refresh_s=None if out else refresh)
    viewer.refresh()
    for line in viewer.problems.unprinted():
        print(f"dlx view: {line}", file=sys.stderr)
    if not viewer.places:
        raise UserError(
            "nothing to show: no RUN given is a run folder, a folder of runs or a `dlx tune` output (the lines above "
            "say why); pass a folder that `dlx pretrain` wrote (--run-dir)"
        )
    if out is None:
        serve(viewer, port, say=lambda line: print(line if line.startswith("dlx view") else f"dlx view: {line}"))
        return
    if out.is_dir():
        raise UserError(f"--out {out} is a folder; give a file name such as {out / 'runs.html'}")
    size = write_page(out, viewer.payload())
    print(f"wrote {out} ({size / 1e6:.2f} MB, {len(viewer.places)} run(s)): one file, every script and style inside")


def register(app: typer.Typer) -> None:
    app.command("view", help=VIEW_HELP)(view)
