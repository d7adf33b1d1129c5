"""What a stage leaves in ``$OUT``: a few archives, not one file per notebook or submission."""

from __future__ import annotations

import tarfile
from pathlib import Path


def pack(out, name, folder, patterns):
    """Files of ``folder`` matching ``patterns`` into one archive, ``out/name``."""
    with tarfile.open(Path(out) / name, "w:gz") as tar:
        for pattern in patterns:
            for path in sorted(Path(folder).glob(pattern)):
                tar.add(path, arcname=str(path.relative_to(folder)))
