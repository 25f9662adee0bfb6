"""The training process's memory settings: freed memory is kept, start-up objects leave the GC.

A GRPO step allocates and frees the same few hundred tensors every time (activations, logits, key
and value caches). glibc's malloc hands large blocks back to the kernel as soon as they are freed
(blocks above its mmap threshold are unmapped; a free top of the heap is trimmed), so the next step
faults every page in again and the kernel zeroes it: on the demo model ~1,100 page faults and ~3 ms
of system time per step. ``keep_freed_memory`` raises those limits so freed blocks stay in the
process for the next step (tensors above 32 MiB are still mapped on their own).

``freeze_startup_objects`` moves everything alive after start-up (the imported libraries, the
model, the tokenizer: ~400,000 objects) out of the cyclic garbage collector's reach; otherwise
every full collection walks them all, ~0.3 s that stops every thread of the trainer at random
steps.

Both act on the whole process, so ``settle_for_training`` applies them where a process exists to
train (a job's attempt, the trainer benchmark), not the trainer itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

# mallopt(3) parameters
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed on 64-bit
TRIM_THRESHOLD = 1 << 30
TOP_PAD = 64 << 20


def keep_freed_memory() -> str:
    """Have glibc keep freed blocks for reuse; says what is active (nothing changes elsewhere)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "default allocator settings (no glibc mallopt here)"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settings = {
        "mmap threshold": (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        "trim threshold": (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        "top pad": (_M_TOP_PAD, TOP_PAD),
    }
    refused = [name for name, (param, value) in settings.items() if mallopt(param, value) != 1]
    if refused:
        return f"allocator settings partly default (mallopt refused the {', '.join(refused)})"
    return f"freed memory kept for reuse (glibc: blocks up to {MMAP_THRESHOLD >> 20} MiB from the heap)"


def freeze_startup_objects() -> int:
    """Collect once, then exempt every object alive now from later collections; returns how many."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def settle_for_training() -> str:
    """Both, once the process has loaded what it trains with; says what is now in effect."""
    kept = keep_freed_memory()
    return f"{kept}; {freeze_startup_objects()} start-up objects frozen"
