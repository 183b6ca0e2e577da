"""Benchmark cases as data: one module per subject and topic exposing `CASES` (see benchmark/author.py)."""
