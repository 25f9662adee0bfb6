"""Jobs: the spec and its validation, the attempt loop, classification, retries and the scheduler.

Import the submodules you need (``plugtune.jobs.spec``, ``plugtune.jobs.validation``, ...); this
package imports nothing heavy on purpose.
"""
