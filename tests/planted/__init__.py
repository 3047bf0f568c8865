"""Wrong implementations planted for the grader's tests: each must be caught by some check.

One module per exercise; every function or class is a classic mistake, named for it.
"""
