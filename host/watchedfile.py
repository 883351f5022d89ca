"""A mounted file's identity, to notice when Kubernetes swaps it (API keys, tenant quotas)."""

from __future__ import annotations

import os

Signature = tuple[int, int, int, int]


def file_signature(path: str | os.PathLike[str]) -> Signature | None:
    """Device, inode, size and mtime of ``path`` (None when it cannot be read).  ``os.stat``
    follows symlinks: a Secret or ConfigMap update swaps the ``..data`` link, so this changes."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
