"""Jobs: the attempt loop, classification, retries and the scheduler (the spec and its validation
are :mod:`plugtune.spec`).

Import the submodules you need; this package imports nothing heavy on purpose.
"""
