"""`dlx view`: runs side by side in a browser, read from what dlx writes into run folders (and `dlx tune`'s JSON).

`sources.py` turns the command's arguments into run folders and tune outputs (local or in a bucket), `files.py` reads
a folder's JSON lines as they grow, `columns.py` keeps a run's step records as columns, `envelope.py` cuts a series
down to the screen as min/max envelopes, `summary.py` derives goodput, the mixture per stage and the config
differences, `payload.py` assembles the one JSON object the page draws, `page.py` writes the self-contained HTML and
`server.py` serves it on 127.0.0.1 and follows running jobs. The page's script (`static/view.js`) draws with uPlot,
vendored in `static/uplot/` with its licence and version.
"""
