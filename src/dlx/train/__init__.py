"""Pretraining: the recipe (`config`, `recipe`), the pieces a run is built from (`run`, `data`, `optim`, `step_plan`),
the step loop (`trainer`), checkpoints (`checkpoint`), evaluation (`eval`) and the embedded demo (`demo`).

Nothing heavy is imported here: `from dlx.train.trainer import pretrain`.
"""
