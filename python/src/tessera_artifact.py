"""What every Tessera loader checks of a `tessera export` directory, with
nothing but the standard library: the format, the Tessera release that
made it, and every file's SHA-256. `tessera_jax` and `tessera_torch` load
through it.

    import tessera_artifact
    man = tessera_artifact.check("out/flash_attention")   # ArtifactError if not whole
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any

__all__ = ["ArtifactError", "check", "manifest", "FORMAT", "FORMAT_VERSION", "__version__"]

# Tessera's version (the workspace's `version` in Cargo.toml; a Rust test
# holds the two equal).
__version__ = "0.1.0"

FORMAT, FORMAT_VERSION = "tessera-export", 2

PathLike = str | os.PathLike[str]


class ArtifactError(ValueError):
    """An exported directory that is not whole: a file missing, changed or
    from another export, or a format this loader does not know."""


def manifest(path: PathLike) -> dict[str, Any]:
    """The manifest of an exported directory, as a dict."""
    return json.loads((pathlib.Path(path) / "manifest.json").read_text())


def _sha256(path: PathLike) -> str:
    """The hex SHA-256 of a file, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _release(version: str) -> list[str]:
    """Major and minor of a version: what an artifact and a loader share."""
    return version.split(".")[:2]


def check(path: PathLike, index: str = "manifest.json") -> dict[str, Any]:
    """Checks that the directory's `index` (a manifest, or `buckets.json`)
    is a Tessera export this loader knows, from the same Tessera release as
    this loader, and that every file it names is there, a regular file, with
    the recorded SHA-256. Returns the index as a dict; raises ArtifactError
    naming the first thing that does not match."""
    d = pathlib.Path(path)
    try:
        man = json.loads((d / index).read_text())
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{d / index}: cannot read it ({e})") from None
    if not isinstance(man, dict):
        raise ArtifactError(f"{d / index}: is a JSON {type(man).__name__}, not an object; export it again")
    if man.get("format") != FORMAT or man.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(
            f"{d / index}: not a {FORMAT} version {FORMAT_VERSION} index "
            f"(format {man.get('format')!r}, version {man.get('format_version')!r}); "
            "export it again with this Tessera")
    made_by = man.get("tessera_version")
    if not isinstance(made_by, str) or _release(made_by) != _release(__version__):
        raise ArtifactError(
            f"{d / index}: exported by Tessera {made_by!r}, but this loader is {__version__}; "
            "install the Python package of the Tessera that exported it (pip install ./python "
            "from that checkout) or export it again with this one")
    files = man.get("files")
    if not isinstance(files, dict) or not files:
        raise ArtifactError(f"{d / index}: names no files")
    for rel, digest in files.items():
        parts = pathlib.PurePosixPath(rel).parts
        if not rel or rel.startswith("/") or "\\" in rel or ".." in parts or "\0" in rel:
            raise ArtifactError(
                f"{d / index}: names the file {rel!r}, which is not a plain path inside the directory; "
                "export it again")
        f = d / rel
        # The file and each folder on the way to it, inside the directory.
        steps = [d.joinpath(*parts[:n]) for n in range(1, len(parts) + 1)]
        if any(p.is_symlink() for p in steps):
            raise ArtifactError(f"{f}: a symbolic link (named by {d / index}); an export writes plain files")
        if not f.is_file():
            raise ArtifactError(f"{f}: missing (named by {d / index}); export it again")
        if _sha256(f) != digest:
            raise ArtifactError(
                f"{f}: its SHA-256 is not the one {d / index} records (a file of another export, "
                "or changed since); export it again")
    return man


