"""Bounded decompression of zip containers (DOCX): a zip bomb is refused before it is
inflated, by its declared sizes and ratios, and while it is inflated, by a byte cap
(declared sizes can lie).

Every member is inflated once here, in chunks, counting bytes; only when the whole
archive stays within the bounds are its bytes handed to the parser, which then reads the
same, checked, bytes again.
"""

from __future__ import annotations

import io
import zipfile
import zlib

from docintel.pipeline.parse.errors import CorruptFile, NotAZip, ZipBomb

# Members per archive: a large Word document has a few hundred (one per image, style,
# header); tens of thousands is an attack on the central directory, not a document.
MAX_MEMBERS = 10_000
# Inflated/compressed size of a member: Word's XML compresses 5-20x, highly repetitive
# tables up to ~100x; zip bombs reach 1,000x and more (deflate's limit is ~1,032x).
MAX_RATIO = 200
# Members smaller than this may have any ratio (a few KiB of zeros are harmless).
RATIO_FLOOR_BYTES = 1024 * 1024
CHUNK = 1024 * 1024


def _bomb(name: str, problem: str) -> ZipBomb:
    return ZipBomb(name, f"refused as a zip bomb: {problem}", "check where the file came from")


def open_zip(name: str, data: bytes) -> zipfile.ZipFile:
    """The archive; NotAZip or CorruptFile when the bytes are not a readable zip."""
    try:
        return zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, NotImplementedError, ValueError, EOFError, OSError):
        if not data.startswith(b"PK"):
            raise NotAZip(
                name,
                "not a zip archive, so not a .docx (a .docx is a zip of XML files)",
                "save it as .docx from Word (an old binary .doc must be converted first)",
            ) from None
        raise CorruptFile(
            name, "a damaged or truncated zip archive", "fetch or save the file again"
        ) from None


def check_declared(name: str, zf: zipfile.ZipFile, max_bytes: int) -> None:
    """Refuse by the central directory alone: member count, total size, ratios."""
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise _bomb(name, f"{len(infos):,} members, over {MAX_MEMBERS:,}")
    total = sum(i.file_size for i in infos)
    if total > max_bytes:
        raise _bomb(name, f"it inflates to {total:,} bytes, over the {max_bytes:,}-byte limit")
    for info in infos:
        ratio = info.file_size / max(info.compress_size, 1)
        if info.file_size > RATIO_FLOOR_BYTES and ratio > MAX_RATIO:
            raise _bomb(name, f"{info.filename} inflates {ratio:,.0f}x, over {MAX_RATIO}x")


def inflate_all(name: str, zf: zipfile.ZipFile, max_bytes: int) -> None:
    """Inflate every member in chunks; refuse as soon as the bytes pass the declared size
    of a member or ``max_bytes`` in all. CorruptFile for a damaged member (bad CRC)."""
    total = 0
    for info in zf.infolist():
        seen = 0
        try:
            with zf.open(info) as member:
                while chunk := member.read(CHUNK):
                    seen += len(chunk)
                    total += len(chunk)
                    if seen > info.file_size or total > max_bytes:
                        raise _bomb(name, f"{info.filename} inflates past its declared size")
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as e:
            raise CorruptFile(
                name, f"member {info.filename} is damaged ({e})", "fetch or save the file again"
            ) from None
        except NotImplementedError as e:  # an unsupported compression method
            raise CorruptFile(
                name, f"member {info.filename}: {e}", "re-save it from Word"
            ) from None


def checked_zip(name: str, data: bytes, max_bytes: int) -> zipfile.ZipFile:
    """The archive, after its declared and its actual sizes were checked."""
    zf = open_zip(name, data)
    check_declared(name, zf, max_bytes)
    inflate_all(name, zf, max_bytes)
    return zf
