"""Benchmarking, above the training package: the memory and FLOPs planner (`estimate`, `dlx plan`) and `dlx bench`
(`command`: the sweep of `sweep`, each point measured by `measure` with the training package's own step)."""
