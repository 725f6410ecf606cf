"""Benchmarks and studies: not shipped in the wheel."""
