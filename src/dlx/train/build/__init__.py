"""The pieces `build_run` assembles; nothing here runs a step: `model` (the model on the meta device, its initial
weights, the strategy), `data` (sources and loaders), `optim` (optimizer, schedule), `step_plan` (batch, accumulation,
steps), `objective` (the loss), `preflight` and `memory_check` (every check knowable before step 1), `restore` (which
folder and checkpoint a run starts from), `console`, `signals`, `progress` (what happened)."""
