"""Benchmarks and the `hisparse-bench` command (decode throughput at the capacity wall)."""
