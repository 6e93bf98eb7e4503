"""Benchmarks of durable_harness: ``python -m bench [storage] [harness]``.

Each benchmark compares against baselines measured in the same run and writes its figures to
``bench/results/<name>.json`` (git-ignored). See :mod:`bench.common` for the conventions.
"""
