"""Metrics: FLOPs conventions, peak tables and MFU, phase timing, the bottleneck verdict, reports."""
