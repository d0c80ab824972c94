"""dlx against what users would pick instead, and the pieces the other benchmarks share with it."""
