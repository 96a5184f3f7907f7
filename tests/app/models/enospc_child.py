"""The download child process on a disk that fills up after 100 kB (for the full-disk test):
its file writes raise ENOSPC as a full disk's would."""

from __future__ import annotations

import errno
import sys

from seqmoe_chat.models import download_job

LIMIT = 100_000
_written = 0
_write = download_job.PartFile.write


def _full_disk_write(self: download_job.PartFile, data: bytes) -> int:
    global _written
    _written += len(data)
    if _written > LIMIT:
        raise OSError(errno.ENOSPC, "No space left on device")
    return _write(self, data)


download_job.PartFile.write = _full_disk_write
sys.exit(download_job.main())
