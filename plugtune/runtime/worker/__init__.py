"""The instance side of the local runtime: a zygote that imports the plugin once and forks
instances, each serving calls over a Unix socket. Imports the standard library, msgpack and
``plugtune.sdk`` only (never the supervisor's modules)."""
