"""``python -m plugtune.runtime.worker zygote|spawn CONFIG_JSON`` (started by the local backend)."""

import sys

from plugtune.runtime.worker.zygote import main

main(sys.argv)
