"""A Python file's bytes as text and back, as Python itself reads them (PEP 263, PEP 3120).

A file may declare its encoding in a coding comment on line 1 or 2 (``# -*- coding: latin-1
-*-``) or start with a UTF-8 BOM; without either it is UTF-8. The rewrite is encoded back in the
file's own encoding, so every byte outside a site stays as it was and the committed rewrite
runs exactly like the original: :func:`encode` refuses (rather than drops or re-declares) text
the encoding cannot hold, and checks that the result still declares the same encoding.
"""
from __future__ import annotations

import codecs
import dataclasses
import io
import tokenize
from typing import Optional


class SourceError(ValueError):
    """Bytes that are not a readable Python source, or text that cannot be written back.

    ``line`` is the 1-based line the problem is on; ``str(exc)`` is the message without a path.
    """

    def __init__(self, message: str, line: int = 1) -> None:
        super().__init__(message)
        self.line = line


@dataclasses.dataclass(frozen=True)
class Decoded:
    text: str  # without the BOM
    encoding: str  # the codec's canonical name, e.g. "utf-8", "iso8859-1"
    bom: bool


def decode(data: bytes) -> Decoded:
    """The text of a Python source file, decoded as the interpreter would (BOM, coding cookie)."""
    try:
        declared, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:  # unknown codec, or a BOM with a non-UTF-8 cookie
        raise SourceError(str(exc.msg if hasattr(exc, "msg") else exc), _cookie_line(data)) from None
    bom = declared == "utf-8-sig"
    encoding = "utf-8" if bom else codecs.lookup(declared).name
    body = data[len(codecs.BOM_UTF8):] if bom else data
    try:
        text = body.decode(encoding)
    except UnicodeDecodeError as exc:
        line = body[: exc.start].count(b"\n") + 1
        what = "not UTF-8" if encoding == "utf-8" else f"not valid {encoding} (as its coding comment declares)"
        raise SourceError(f"{what} (byte 0x{body[exc.start]:02x} at offset {exc.start})", line) from None
    if text.encode(encoding) != body:
        # A codec with several byte spellings of one character: writing the rewrite back would
        # change bytes the user wrote.
        raise SourceError(f"encoding {encoding} does not give back the same bytes; left unchanged", _cookie_line(data))
    return Decoded(text, encoding, bom)


def encode(text: str, like: Decoded) -> bytes:
    """``text`` (a rewrite of ``like.text``) as bytes in the original's encoding (and BOM)."""
    try:
        body = text.encode(like.encoding)
    except UnicodeEncodeError as exc:
        line = text[: exc.start].count("\n") + 1
        raise SourceError(
            f"the rewrite holds {text[exc.start]!r}, which {like.encoding} (the file's declared encoding) cannot hold",
            line,
        ) from None
    data = (codecs.BOM_UTF8 if like.bom else b"") + body
    if like.encoding != "utf-8" or like.bom:
        try:
            again, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        except SyntaxError:
            again = None
        same = again is not None and (again == "utf-8-sig") == like.bom
        if not same or ("utf-8" if like.bom else codecs.lookup(again).name) != like.encoding:
            raise SourceError(f"the rewrite moved the coding comment off lines 1-2 (was {like.encoding})", 1)
    return data


def _cookie_line(data: bytes) -> int:
    first, _, rest = data.partition(b"\n")
    return 2 if b"coding" not in first and b"coding" in rest.partition(b"\n")[0] else 1


def decode_for_display(data: Optional[bytes]) -> str:
    """Text for showing a file to a person (review diffs): as Python reads it where it can,
    else UTF-8 with replacement characters; never raises."""
    if data is None:
        return ""
    try:
        return decode(data).text
    except SourceError:
        return data.decode("utf-8", errors="replace")
