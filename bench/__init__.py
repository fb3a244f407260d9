"""Benchmarks that print figures; each file runs as a script (``python bench/NAME.py``)."""
