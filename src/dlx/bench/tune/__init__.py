"""`dlx tune`: `search` (`run_tune`: enumerate, prune, rank, measure, pick), `space` (the layouts a recipe allows),
`select` (what `dlx plan` admits), `time_model` (the time model and its calibration), `rates` (matmul, copy, link and
attention rates measured here), `report` (the tuned recipe, the table, the JSON)."""
