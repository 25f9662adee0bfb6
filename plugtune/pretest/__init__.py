"""Testing a job's plugins before the job: ``plugtune test`` (in-process), ``plugtune test --faas``
(the function runtime with real limits, optional fault injection) and ``plugtune replay``."""
