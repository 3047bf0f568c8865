"""Parallelism techniques, one file each: ``data`` (data parallelism), ``accumulate`` (gradient
accumulation), and the lessons that follow (pipeline, tensor, ...).

Import what a lesson teaches from its own module, e.g. ``from simlib.parallel.data import DataParallelBucket``.
"""
