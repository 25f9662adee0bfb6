"""``python -m plugtune.runtime.worker zygote|spawn FD`` (started by the local backend; FD holds the
config's JSON: argv, which every user can read in /proc, carries no part of it)."""

import sys

from plugtune.runtime.worker.zygote import main

main(sys.argv)
