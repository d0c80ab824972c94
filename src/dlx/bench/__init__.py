"""Benchmarking: the memory and FLOPs planner (`estimate`) and the configuration sweep (`dlx bench`)."""
