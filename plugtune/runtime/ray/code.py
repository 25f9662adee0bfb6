"""Shipping code to the cluster: the plugin's snapshot, and plugtune itself, each one zip in Ray's
GCS named by its content.

Actors get the snapshot as ``runtime_env={"working_dir": uri}``; Ray unpacks it once per node and
every instance runs exactly the files the console shows. Everything in the snapshot ships: its
``.gitignore`` (if the user's folder had one) is not applied. plugtune's own package ships as a
``py_modules`` entry, so a node needs only Python and Ray (see ``nodes``), and runs the driver's
plugtune whatever it has installed.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import plugtune

log = logging.getLogger(__name__)

PACKAGE = Path(plugtune.__file__).resolve().parent
PACKAGE_EXCLUDES = ["__pycache__/", "*.pyc"]  # compiled per node; the hash stays the source's


def ship(code_root: Path) -> str:
    """Upload ``code_root`` unless the cluster has it already; returns its ``gcs://`` URI."""
    from ray._private.runtime_env.packaging import get_uri_for_directory, upload_package_if_needed

    uri: str = get_uri_for_directory(str(code_root), include_gitignore=False)
    with tempfile.TemporaryDirectory(prefix="plugtune-ship-") as scratch:
        upload_package_if_needed(uri, scratch, str(code_root), include_gitignore=False, logger=log)
    return uri


def ship_plugtune() -> str:
    """Upload this process's plugtune package (the ``plugtune/`` folder itself) unless the cluster
    has it already; returns the ``gcs://`` URI for ``runtime_env["py_modules"]``."""
    from ray._private.runtime_env.packaging import get_uri_for_directory, upload_package_if_needed

    uri: str = get_uri_for_directory(str(PACKAGE), include_gitignore=False, excludes=PACKAGE_EXCLUDES)
    with tempfile.TemporaryDirectory(prefix="plugtune-ship-") as scratch:
        upload_package_if_needed(
            uri,
            scratch,
            str(PACKAGE),
            include_gitignore=False,
            include_parent_dir=True,  # unpacked as <dir>/plugtune/..., <dir> on the node's sys.path
            excludes=PACKAGE_EXCLUDES,
            logger=log,
        )
    return uri
