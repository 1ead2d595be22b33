"""Benchmark scripts: they measure and print; tests never assert their numbers."""
