"""Benchmarks behind ``mgpu bench``: each times mgpu and its peers in one run.

Results are medians over repeats after warm-up; GPU times come from CUDA events.
"""
