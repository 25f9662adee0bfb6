"""The job's configuration: ``job.yaml`` read within bounds (``job_yaml``), typed (``models.JobSpec``,
whose ``hyperparameters`` are the trainer's own ``TrainerConfig``), and validated with its paths,
plugin entries and dataset rows (``validation``, ``rows``, ``reach``, ``plugin_names``).

The CLI, lint, pretest, the integrations and the jobs layer import it; it imports only the layers
below (the runtime's dependency facts, the trainer's config and signal thresholds, the SDK).
Import the submodules you need; this package imports nothing on purpose.
"""
