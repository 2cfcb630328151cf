"""Generated data kept between jobs: MNIST-1D takes 5-7 s to make on every rank of every launch (2 s of it importing
``mnist1d`` and SciPy), several times a job's own training at the examples' sizes, so it is made once per machine
and read back as a plain ``.npz`` (no pickle) from the user's cache folder."""

from __future__ import annotations

import logging
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

log = logging.getLogger("fast_core.data")

Arrays = dict[str, np.ndarray]


def cache_folder() -> Path:
    """``$XDG_CACHE_HOME/fast-training`` (``~/.cache/fast-training`` by default), the freedesktop convention."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "fast-training"


def cached_arrays(name: str, make: Callable[[], Arrays]) -> Arrays:
    """The arrays ``make()`` returns, read from ``<cache>/<name>.npz`` when an earlier call wrote them.

    ``name`` must change whenever what ``make`` returns would (a version, a seed). A file that does not load (cut
    short, another format) is made again; a folder that cannot be written only costs the making. Ranks that start
    together may all make it once: each writes a file of its own and renames it into place, so a reader never
    sees half a file.
    """
    path = cache_folder() / f"{name}.npz"
    try:
        with np.load(path, allow_pickle=False) as saved:
            return {key: saved[key] for key in saved.files}
    except FileNotFoundError:
        pass
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # a truncated or foreign file: make it again
        log.warning("the cached %s does not load (%s); making it again", path, exc)
    arrays = make()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{name}-", suffix=".npz", dir=path.parent)
        with os.fdopen(handle, "wb") as file:
            np.savez(file, **arrays)
        os.replace(temporary, path)
    except OSError as exc:
        log.info("%s not cached: %s", name, exc)
    return arrays
