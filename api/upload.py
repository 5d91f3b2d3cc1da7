"""Streaming multipart upload: the request body goes straight to a temp file, counted as it comes.

Starlette's own form parsing (`UploadFile`) reads the whole body before the route runs, so a
size limit checked in the route would only trigger after a 10 GB upload had been received and
spooled. Here the `multipart/form-data` stream is fed to python-multipart's push parser chunk
by chunk; the file part is written to a temp file in a caller-chosen folder (the artifact
volume, so the final move is a rename) while its bytes are counted and hashed, and reading
stops with a 413 at the first chunk past the limit.

Requests whose `Content-Length` already says they are too big are refused before any byte is
read. The allowance `MULTIPART_OVERHEAD` covers the boundaries and part headers around the file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from fastapi import Request
from python_multipart.exceptions import FormParserError
from starlette.requests import ClientDisconnect
from python_multipart.multipart import MultipartParser, parse_options_header

from api.errors import ApiError

MULTIPART_OVERHEAD = 64 * 1024
MAX_FIELD_BYTES = 4096  # plain form fields (the dataset name) are small
MAX_PARTS = 8


@dataclass
class Upload:
    """What arrived: the file (in a temp file the caller must move or delete) and the fields."""

    path: Path | None = None
    filename: str | None = None
    nbytes: int = 0
    sha256: str = ""
    fields: dict[str, str] = field(default_factory=dict)

    def discard(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"upload exceeds the limit of {limit} bytes")


class _Parts:
    """python-multipart callbacks: collects part headers, routes data to the file or a field."""

    def __init__(self, file_field: str):
        self.file_field = file_field
        self.header_name = b""
        self.header_value = b""
        self.disposition = b""
        self.current: str | None = None  # name of the part being read
        self.is_file = False
        self.field_buf = bytearray()
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.file_seen = False
        self.pending: list[bytes] = []  # file data to write after this chunk was parsed
        self.parts = 0

    def on_part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise ApiError(422, f"at most {MAX_PARTS} multipart parts")
        self.disposition, self.current, self.is_file = b"", None, False
        self.field_buf = bytearray()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def on_header_end(self) -> None:
        if self.header_name.lower() == b"content-disposition":
            self.disposition = self.header_value
        self.header_name, self.header_value = b"", b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.disposition)
        if b"name" not in options:
            raise ApiError(422, "a multipart part has no name")
        self.current = options[b"name"].decode("utf-8", "replace")
        if self.current == self.file_field:
            if self.file_seen:
                raise ApiError(422, f"send one `{self.file_field}` part", field=self.file_field)
            self.file_seen, self.is_file = True, True
            raw = options.get(b"filename")
            self.filename = raw.decode("utf-8", "replace") if raw is not None else None

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.is_file:
            self.pending.append(bytes(data[start:end]))
            return
        self.field_buf += data[start:end]
        if len(self.field_buf) > MAX_FIELD_BYTES:
            raise ApiError(422, f"form field {self.current!r} is too long", field=self.current)

    def on_part_end(self) -> None:
        if not self.is_file and self.current is not None:
            self.fields[self.current] = self.field_buf.decode("utf-8", "replace")

    def callbacks(self) -> dict:
        return {name: getattr(self, name) for name in (
            "on_part_begin", "on_header_field", "on_header_value", "on_header_end",
            "on_headers_finished", "on_part_data", "on_part_end")}


def _check_request(request: Request, max_bytes: int) -> bytes:
    """The boundary, after refusing non-multipart bodies and too-large Content-Lengths."""
    ctype, params = parse_options_header(request.headers.get("content-type", ""))
    if ctype != b"multipart/form-data" or b"boundary" not in params:
        raise ApiError(415, "send multipart/form-data with a `file` part")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes + MULTIPART_OVERHEAD:
        raise too_large(max_bytes)
    return params[b"boundary"]


async def receive_upload(request: Request, tmp_dir: Path, max_bytes: int,
                         file_field: str = "file") -> Upload:
    """Stream the request's multipart body; the file part lands in a temp file in `tmp_dir`.

    Raises ApiError 413 past `max_bytes` of file data and 415/422 for malformed requests;
    on any error the temp file is already gone.
    """
    boundary = _check_request(request, max_bytes)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=tmp_dir, prefix=".upload-", suffix=".part")
    upload = Upload(path=Path(name))
    parts = _Parts(file_field)
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            parser = MultipartParser(boundary, parts.callbacks())
            received = 0
            async for chunk in request.stream():
                # Every byte counts, form fields and part headers too, not just the file's.
                received += len(chunk)
                if received > max_bytes + MULTIPART_OVERHEAD:
                    raise too_large(max_bytes)
                parser.write(chunk)
                for piece in parts.pending:
                    upload.nbytes += len(piece)
                    if upload.nbytes > max_bytes:
                        raise too_large(max_bytes)  # stop reading: the rest is never received
                    digest.update(piece)
                    # Disk writes go to a thread so a slow volume doesn't stall the event loop.
                    await anyio.to_thread.run_sync(out.write, piece)
                parts.pending.clear()
            parser.finalize()
    except FormParserError as exc:
        upload.discard()
        raise ApiError(422, f"malformed multipart body: {exc}") from None
    except ClientDisconnect:  # the client went away: nothing to answer, nothing to log loudly
        upload.discard()
        raise ApiError(400, "the client disconnected during the upload") from None
    except BaseException:
        upload.discard()
        raise
    if not parts.file_seen:
        upload.discard()
        raise ApiError(422, f"the `{file_field}` part is missing", field=file_field)
    upload.filename, upload.fields = parts.filename, parts.fields
    upload.sha256 = digest.hexdigest()
    return upload
