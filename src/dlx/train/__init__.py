"""Pretraining, one package per concern. At the top: the doors (`launch`: command line → pretrain; `demo`), `run`
(`build_run`: the `Run`, read-only once built), `start` (the checks before anything is built; the header), `recipe`
(YAML + overrides, validated once) and `config` (the recipe's schema). Below them, from the top:

- `loop/`: the step loop and what it writes per step (`trainer`, `accumulate`, `saving`, `finish`, `records`, `eval`);
- `observers/`: everything a run does besides its steps, behind one `Observer` interface;
- `build/`: the pieces `build_run` assembles (model, data, optimizer, step plan, preflight); nothing there runs a step;
- `init/`: continued pretraining: `model.init_from` resolved once, vocabulary growth;
- `rundir/`: the run folder, local or in a bucket: checkpoints, their records, the lock, finding trained weights.

A module imports from its own package or a lower one, never up (tests/unit/test_layering.py). Nothing heavy is
imported here: `from dlx.train.loop.trainer import pretrain`.
"""
