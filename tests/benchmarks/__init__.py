"""Speed and results commands (benchmarks, never timed tests): python -m tests.benchmarks.<name>."""
