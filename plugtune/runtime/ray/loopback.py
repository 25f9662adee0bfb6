"""Keeping a Ray cluster on 127.0.0.1.

Ray 2.60 rewrites every loopback host it is given (``--node-ip-address=127.0.0.1``,
``--address=127.0.0.1:PORT``, ``ray.init("127.0.0.1:PORT")``, ``_node_ip_address=``) through
``ray._private.services.resolve_ip_for_localhost`` into the address the host routes to 8.8.8.8 —
here the external 192.0.2.2 — so nodes register, advertise and dial that address. The only switch
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``) also forbids a second node. So, for a cluster that is
meant to stay on this machine, plugtune keeps loopback hosts as given, in the ``ray start``
processes (``python -m plugtune.runtime.ray.loopback start ...``) and in the driver; Ray passes
the node address on to every process it starts (GCS, raylet, agents, workers) explicitly.
"""

from __future__ import annotations

import sys

LOOPBACK_HOSTS = ("127.0.0.1", "localhost")


def is_loopback(address: str | None) -> bool:
    """``address`` (``host`` or ``host:port``) names this machine's loopback interface."""
    if not address:
        return False
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 else address
    return host in LOOPBACK_HOSTS


def keep_loopback() -> None:
    """Make this process's Ray keep 127.0.0.1 instead of resolving it to the external address."""
    from ray._private import services

    services.resolve_ip_for_localhost = _as_given


def _as_given(host: str) -> str:
    if not host:
        raise ValueError(f"Malformed host: {host}")
    return "127.0.0.1" if host == "localhost" else host


def main() -> None:
    """The ``ray`` CLI with loopback hosts kept (``python -m plugtune.runtime.ray.loopback start ...``)."""
    keep_loopback()
    from ray.scripts.scripts import main as ray_main

    sys.argv = ["ray", *sys.argv[1:]]
    ray_main()


if __name__ == "__main__":
    main()
