"""Benchmarks that reproduce the paper's ablations and measure speed (`python -m benchmarks`)."""
