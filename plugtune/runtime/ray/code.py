"""Shipping a code snapshot to the cluster: one zip in Ray's GCS, named by the snapshot's content.

Actors then get it as ``runtime_env={"working_dir": uri}``; Ray unpacks it once per node and every
instance runs exactly the files the console shows. Everything in the snapshot ships: its
``.gitignore`` (if the user's folder had one) is not applied.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)


def ship(code_root: Path) -> str:
    """Upload ``code_root`` unless the cluster has it already; returns its ``gcs://`` URI."""
    from ray._private.runtime_env.packaging import get_uri_for_directory, upload_package_if_needed

    uri: str = get_uri_for_directory(str(code_root), include_gitignore=False)
    with tempfile.TemporaryDirectory(prefix="plugtune-ship-") as scratch:
        upload_package_if_needed(uri, scratch, str(code_root), include_gitignore=False, logger=log)
    return uri
