"""dlx against what users would pick instead (issue 7), and the pieces the other benchmarks share with it."""
