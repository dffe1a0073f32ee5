"""Parquet files whose rows hold images as bytes: Hugging Face datasets, img2dataset, LAION-style
tables.

The image column holds one image per row: a Hugging Face ``Image`` feature (a struct of ``bytes``
and ``path``), or a binary column of encoded images, plain or dictionary-encoded (read by decoding
the dictionary). It is named by the caller (``--image-column``) or found: a column the file's
Hugging Face metadata (``huggingface`` schema key) declares an ``Image``, else a struct with a
binary ``bytes`` field, else a binary column named ``image``, ``img``, ``jpg``, ``jpeg``, ``png``
or ``webp`` (in that order), else, when no column holds image bytes, a column of that name whose
every cell is null (Arrow's null type, as pandas writes an all-None column): its rows hold no
image. A column holding a list of
images per row (a Hugging Face ``Sequence(Image)`` / ``List(Image)``, ``list<binary>``) is not
read: a file whose images are only there is a ParquetInputError that says so, as is a column of
an image name holding anything else (text, numbers), and an image column whose name the file
gives to two columns. A row's key is its ``key``, ``__key__`` or ``id`` column as text when the
table has one of text, integers or text categories (dictionary-encoded), else its row index; a
row whose key cell is null takes its row index too.

Files are read in record batches of ``BATCH_ROWS`` rows, every column as stored; image bytes are
never decoded or re-encoded here. A local file must be a regular file; an fsspec URL is opened
with random access (Parquet keeps its schema at the end); a ``pipe:`` command's output, or a file
from an http(s) server that answers no range requests, is copied once into an anonymous temporary
file and read from there. Writers (``RowGroupWriter``) keep the input's Arrow schema, its metadata
and dictionary types included, and write row groups of at most ``ROW_GROUP_ROWS`` rows or
``ROW_GROUP_BYTES`` bytes; a dictionary column's dictionary there holds only its rows' values.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from collapseguard.errors import CollapseguardError
from collapseguard.io.terminal import printable
from collapseguard.io.urls import filesystem, local_path, scheme

#: binary columns taken for images when no other says so, in this order
IMAGE_COLUMN_NAMES = ("image", "img", "jpg", "jpeg", "png", "webp")
#: columns taken for a row's key, in this order (else the row index)
ID_COLUMN_NAMES = ("key", "__key__", "id")
#: rows read at a time
BATCH_ROWS = 64
#: a written row group holds at most this many rows ...
ROW_GROUP_ROWS = 1024
#: ... or about this many bytes (images are large: a group of a few thousand can be gigabytes)
ROW_GROUP_BYTES = 128 << 20


class ParquetInputError(CollapseguardError, ValueError):
    """A Parquet input that cannot be read as images: not Parquet, no image column, a ``pipe:``."""


def _is_binary(t: pa.DataType) -> bool:
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return True
    view = getattr(pa.types, "is_binary_view", None)
    return bool(view and view(t))


def _is_binary_dictionary(t: pa.DataType) -> bool:
    """A dictionary-encoded binary column (each row an index into a dictionary of bytes)."""
    return pa.types.is_dictionary(t) and _is_binary(t.value_type)


def _is_image_struct(t: pa.DataType) -> bool:
    """A Hugging Face ``Image`` struct: a struct with a binary ``bytes`` field."""
    if not pa.types.is_struct(t):
        return False
    idx = t.get_field_index("bytes")
    return idx >= 0 and _is_binary(t.field(idx).type)


def _holds_image(t: pa.DataType) -> bool:
    """A column of one image per row, as read here."""
    return _is_binary(t) or _is_binary_dictionary(t) or _is_image_struct(t)


def _is_null_image_column(f: pa.Field) -> bool:
    """A column of Arrow's null type with an image column's name: what pandas writes for an image
    column whose every cell is None. Its rows hold no image (``no_image``), like null cells."""
    return pa.types.is_null(f.type) and f.name.lower() in IMAGE_COLUMN_NAMES


def _duplicated(schema: pa.Schema) -> set[str]:
    seen: set[str] = set()
    return {n for n in schema.names if n in seen or seen.add(n)}


#: the list types (the list views where this pyarrow has them)
_LIST_CHECKS = tuple(check for check in (getattr(pa.types, n, None) for n in (
    "is_list", "is_large_list", "is_fixed_size_list", "is_list_view", "is_large_list_view")) if check)


def _is_list(t: pa.DataType) -> bool:
    return any(check(t) for check in _LIST_CHECKS)


def _is_image_list(t: pa.DataType) -> bool:
    """A column of a list of images per row (``list<struct<bytes, path>>``, ``list<binary>``...)."""
    return _is_list(t) and (_holds_image(t.value_type) or _is_image_list(t.value_type))


def _hf_features(schema: pa.Schema) -> dict:
    """The features of the file's Hugging Face metadata (``huggingface`` schema key), if any."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return {}
    try:
        features = json.loads(raw).get("info", {}).get("features", {})
    except (ValueError, AttributeError):
        return {}
    return features if isinstance(features, dict) else {}


def _declares_image(feature) -> bool:
    return isinstance(feature, dict) and feature.get("_type") == "Image"


def _declares_image_list(feature) -> bool:
    """A ``Sequence(Image)`` / ``List(Image)`` feature (or a list of those), also as ``[Image]``."""
    if isinstance(feature, list):
        return len(feature) == 1 and (_declares_image(feature[0]) or _declares_image_list(feature[0]))
    if not isinstance(feature, dict) or "feature" not in feature:
        return False
    inner = feature["feature"]
    return _declares_image(inner) or _declares_image_list(inner)


def _hf_image_columns(schema: pa.Schema) -> list[str]:
    """Columns the Hugging Face metadata declares ``Image`` features."""
    return [name for name, f in _hf_features(schema).items() if _declares_image(f)]


def _image_list_columns(schema: pa.Schema) -> list[str]:
    """Columns holding a list of images per row, by their type or the Hugging Face metadata."""
    declared = {name for name, f in _hf_features(schema).items() if _declares_image_list(f)}
    return [f.name for f in schema if _is_image_list(f.type)
            or (f.name in declared and not _holds_image(f.type))]


def _image_list_error(prefix: str, schema: pa.Schema, name: str, others: bool) -> ParquetInputError:
    hint = "; name a column of one image per row with --image-column" if others else ""
    kind = next(f.type for f in schema if f.name == name)  # the first, if two share the name
    return ParquetInputError(f"{prefix}column {printable(name)!r} holds a list of images per row "
                             f"({kind}), which is not read: collapseguard "
                             f"judges one image per row{hint}")


def find_image_column(schema: pa.Schema, requested: str | None = None, where: str = "") -> str:
    """The column holding the images (see the module docstring); ParquetInputError if none, or
    if the images are in a column holding a list of images per row."""
    prefix = f"{printable(where)}: " if where else ""
    name = _find_image_column(schema, requested, prefix)
    if name in _duplicated(schema):
        raise ParquetInputError(f"{prefix}the file has two columns named {printable(name)!r}: "
                                "which holds the images is ambiguous")
    return name


def _find_image_column(schema: pa.Schema, requested: str | None, prefix: str) -> str:
    usable = {f.name for f in schema if _holds_image(f.type)}
    lists = _image_list_columns(schema)
    if requested:
        if requested not in schema.names:
            raise ParquetInputError(f"{prefix}no column {requested!r} (--image-column); columns: "
                                    f"{', '.join(map(printable, schema.names))}")
        if requested in _duplicated(schema):
            return requested  # refused by the caller, which names the duplicate
        if pa.types.is_null(schema.field(requested).type):
            return requested  # every cell null: rows without an image
        if requested in lists:
            raise _image_list_error(prefix, schema, requested, others=bool(usable))
        if requested not in usable:
            raise ParquetInputError(f"{prefix}column {requested!r} holds "
                                    f"{schema.field(requested).type}, not image bytes (binary, "
                                    "dictionary-encoded binary, or a struct with a binary 'bytes' "
                                    "field)")
        return requested
    for name in _hf_image_columns(schema):
        if name in usable:
            return name
    structs = [f.name for f in schema if _is_image_struct(f.type)]
    if structs:
        return structs[0]
    for name in IMAGE_COLUMN_NAMES:
        for f in schema:
            if f.name.lower() == name and f.name in usable:
                return f.name
    if lists:
        raise _image_list_error(prefix, schema, lists[0], others=bool(usable))
    empty = [f.name for f in schema if _is_null_image_column(f)]
    if empty and not usable:  # no column holds image bytes, and this one holds no value at all
        return empty[0]
    named = [f for f in schema if f.name.lower() in IMAGE_COLUMN_NAMES]
    if named:
        raise ParquetInputError(f"{prefix}column {printable(named[0].name)!r} holds "
                                f"{named[0].type}, not image bytes (binary, dictionary-encoded "
                                "binary, or a struct with a binary 'bytes' field; base64 text is "
                                "not decoded); name the column of image bytes with --image-column")
    raise ParquetInputError(f"{prefix}no image column (a Hugging Face Image struct, or binary "
                            f"{', '.join(IMAGE_COLUMN_NAMES)}); name it with --image-column; "
                            f"columns: {', '.join(map(printable, schema.names))}")


def other_image_columns(schema: pa.Schema, chosen: str) -> list[str]:
    """The columns beside ``chosen`` that ``find_image_column`` would take for images (declared
    ``Image`` features, image structs, binary columns with an image name): images a row holds and
    nothing judges unless named."""
    usable = {f.name for f in schema if _holds_image(f.type)}
    named = {f.name for f in schema if f.name.lower() in IMAGE_COLUMN_NAMES}
    structs = {f.name for f in schema if _is_image_struct(f.type)}
    found = (set(_hf_image_columns(schema)) | structs | named) & usable
    return [n for n in schema.names if n in found and n != chosen]


def find_id_column(schema: pa.Schema) -> str | None:
    """The column a row's key is read from (text or integers), None when the row index is used."""
    for name in ID_COLUMN_NAMES:
        if schema.names.count(name) == 1:
            t = schema.field(name).type
            if _is_text(t) or pa.types.is_integer(t.value_type if pa.types.is_dictionary(t) else t):
                return name
    return None


def _spooled(name: str, max_bytes: int | None = None):
    """The whole body of ``name`` (a ``pipe:`` command, or a server that answers no range
    requests) in an anonymous temporary file, read once front to back. More than ``max_bytes``
    (default ``io.tar.MAX_SHARD_BYTES``) is ``io.tar.ShardTooLargeError``: a source that never
    ends does not fill the disk."""
    import tempfile

    from collapseguard.io.tar import MAX_SHARD_BYTES, check_shard_bytes
    from collapseguard.io.urls import open_stream
    limit = MAX_SHARD_BYTES if max_bytes is None else max_bytes
    tmp = tempfile.TemporaryFile()  # noqa: SIM115 - handed to the caller, closed with the reader
    try:
        with open_stream(name) as src:
            size = 0
            while chunk := src.read(1 << 20):
                size += len(chunk)
                check_shard_bytes(size, limit, printable(name), "read")
                tmp.write(chunk)
        tmp.seek(0)
    except BaseException:
        tmp.close()
        raise
    return tmp


def _parquet_file(name: str, f) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(f)
    except (pa.ArrowInvalid, OSError) as exc:  # OSError: a footer whose metadata does not parse
        f.close()
        raise ParquetInputError(f"{printable(name)}: not a readable Parquet file ({exc})") from None
    except BaseException:
        f.close()
        raise


def _check_size(f, size: int | None, limit: int, name: str) -> None:
    """A file read with random access counts its whole size against the limit on one shard
    (``--max-shard-bytes``), as a tar shard counts the bytes it is read to."""
    from collapseguard.io.tar import check_shard_bytes
    if size is None:
        return
    try:
        check_shard_bytes(size, limit, printable(name), "in the file")
    except BaseException:
        f.close()
        raise


def open_parquet(name: str, max_bytes: int | None = None) -> pq.ParquetFile:
    """A Parquet file by name: a local regular file, an fsspec URL read with random access, or
    (a ``pipe:`` command the user gave, or an http(s) server that answers no range requests) the
    whole body copied once into an anonymous temporary file, up to ``max_bytes`` (``_spooled``;
    default ``io.tar.MAX_SHARD_BYTES``). A file read with random access larger than ``max_bytes``
    is ``io.tar.ShardTooLargeError`` too."""
    from collapseguard.io.tar import MAX_SHARD_BYTES, open_regular_file
    limit = MAX_SHARD_BYTES if max_bytes is None else max_bytes
    path = local_path(name)
    if path is not None:
        f = open_regular_file(path)
        _check_size(f, os.fstat(f.fileno()).st_size, limit, name)
        return _parquet_file(name, f)
    if scheme(name) == "pipe":
        return _parquet_file(name, _spooled(name, max_bytes))
    fs, p = filesystem(name)
    f = fs.open(p, "rb")
    _check_size(f, getattr(f, "size", None), limit, name)
    try:
        return _parquet_file(name, f)
    except ValueError as exc:  # fsspec's http: "doesn't appear to support range requests"
        if "range requests" not in str(exc):
            raise
    return _parquet_file(name, _spooled(name, max_bytes))


@contextlib.contextmanager
def parquet_file(name: str, max_bytes: int | None = None) -> Iterator[pq.ParquetFile]:
    """``open_parquet`` as a context: the file (or temporary copy) is closed on leaving."""
    pf = open_parquet(name, max_bytes)
    try:
        yield pf
    finally:
        pf.close(force=True)


@dataclass
class Row:
    """One row of a Parquet input: its index, key and image bytes (None when the row has none),
    and the record batch it came from with its place there (for writing the row back as it is)."""

    index: int
    key: str
    data: bytes | None
    column: str
    batch: pa.RecordBatch
    pos: int
    #: why the row has no image ("" when it has one)
    missing: str = ""

    @property
    def members(self) -> list[tuple[str, bytes]]:
        """The row's image as the scoring loop takes it: ``[(column, bytes)]``, or none."""
        return [(self.column, self.data)] if self.data is not None else []


def _image_bytes(value, struct: bool) -> tuple[bytes | None, str]:
    if struct:
        if value is None:
            return None, "the image is null"
        data = value.get("bytes")
        if data is None:
            path = value.get("path")
            return None, ("the image holds no bytes (only the path " f"{printable(str(path))!r})"
                          if path else "the image holds no bytes")
        return data, ""
    return (value, "") if value is not None else (None, "the image is null")


def read_rows(pf: pq.ParquetFile, image_column: str, *, all_columns: bool = True,
              batch_rows: int = BATCH_ROWS) -> Iterator[Row]:
    """Every row of ``pf`` in order, with its image bytes. ``all_columns=False`` reads only the
    image and key columns (scoring); the batches then hold just those."""
    schema = pf.schema_arrow
    id_col = find_id_column(schema)
    struct = _is_image_struct(schema.field(image_column).type)
    columns = None if all_columns else [c for c in (image_column, id_col) if c]
    start = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False):
        images = batch.column(batch.schema.get_field_index(image_column))
        if pa.types.is_dictionary(images.type):
            images = images.dictionary_decode()
        images = images.to_pylist()
        ids = batch.column(batch.schema.get_field_index(id_col)).to_pylist() if id_col else None
        for i, value in enumerate(images):
            data, missing = _image_bytes(value, struct)
            key = ids[i] if ids is not None and ids[i] is not None else start + i
            yield Row(start + i, str(key), data, image_column, batch, i, missing)
        start += batch.num_rows


def may_hold_images(name: str, image_column: str | None = None) -> bool:
    """Could the Parquet file ``name`` hold images: has it a column of image bytes (binary,
    dictionary-encoded binary, a struct with a binary ``bytes`` field), a column of lists of those,
    a column its Hugging Face metadata declares an ``Image`` or a list of them, a struct with a
    ``bytes`` field of any type, or a column of an image name (``IMAGE_COLUMN_NAMES``, or the one
    ``image_column`` names, ``--image-column``) that is not short text: rows whose cells are all
    null (pandas' all-None column), or text whose values average ``LONG_TEXT_BYTES`` or more (an
    image as base64), read from the footer's sizes without reading a value? False for a file
    whose schema reads and has none (a scores, groups or metadata table found in a folder, whose
    ``image`` column holds member names as short text; one without rows). A file that cannot be
    read, or whose image column holds something other than bytes, counts as one that may, so its
    reader says what is wrong with it, instead of the folder passing over it without a word."""
    try:
        with parquet_file(name) as pf:
            schema = pf.schema_arrow
            if (any(_holds_image(f.type) for f in schema) or _image_list_columns(schema)
                    or _hf_image_columns(schema)
                    or any(pa.types.is_struct(f.type) and f.type.get_field_index("bytes") >= 0
                           for f in schema)):
                return True
            if pf.metadata.num_rows == 0:  # no rows: nothing to lose
                return False
            return any(_named_column_may_hold(pf, f, image_column) for f in schema
                       if f.name.lower() in IMAGE_COLUMN_NAMES or f.name == image_column)
    except Exception:  # noqa: BLE001 - judged by the reader, which names the error
        return True


#: text values of at least this many bytes on average are no member names or paths: base64 images
LONG_TEXT_BYTES = 512


def _is_text(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    view = getattr(pa.types, "is_string_view", None)
    return pa.types.is_string(t) or pa.types.is_large_string(t) or bool(view and view(t))


def _named_column_may_hold(pf: pq.ParquetFile, f: pa.Field, image_column: str | None) -> bool:
    """A column of an image name (or the one ``--image-column`` names) that holds no image bytes:
    all null, long text (base64 images), or, for the named one, any type but short text."""
    if pa.types.is_null(f.type):
        return True
    if _is_text(f.type):
        return _long_text(pf, f.name)
    return f.name == image_column


def _long_text(pf: pq.ParquetFile, column: str) -> bool:
    """Do the values of the text column ``column`` average ``LONG_TEXT_BYTES`` or more, by the
    uncompressed sizes the footer records for its chunks?"""
    meta = pf.metadata
    size = rows = 0
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        for j in range(rg.num_columns):
            if rg.column(j).path_in_schema == column:
                size += rg.column(j).total_uncompressed_size
                rows += rg.num_rows
    return rows > 0 and size / rows >= LONG_TEXT_BYTES


def count_rows(name: str) -> int | None:
    """The number of rows from the file's footer; None when it cannot be read, and for a
    ``pipe:`` command (counting would run it, and copy its output, once more)."""
    if scheme(name) == "pipe":
        return None
    try:
        with parquet_file(name) as pf:
            return pf.metadata.num_rows
    except Exception:  # noqa: BLE001 - a count for a progress bar; the read says what is wrong
        return None


def _decoded_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with each dictionary column as its values' type."""
    for i, f in enumerate(schema):
        if pa.types.is_dictionary(f.type):
            schema = schema.set(i, f.with_type(f.type.value_type))
    return schema


class RowGroupWriter:
    """Rows written to a Parquet file in order, with the input's schema (metadata included), in
    row groups of at most ``ROW_GROUP_ROWS`` rows or about ``ROW_GROUP_BYTES`` bytes. A
    dictionary column is held decoded until its row group is written, then encoded again as the
    schema says: each row group's dictionary holds the values of its rows only, not the input's
    whole dictionary, and the bytes counted are those of the rows."""

    def __init__(self, path: str, schema: pa.Schema):
        self._writer = pq.ParquetWriter(path, schema)
        self._schema = schema
        self._plain = _decoded_schema(schema)
        self._parts: list[pa.RecordBatch] = []
        self._rows = 0
        self._bytes = 0
        self.rows_written = 0

    def _decode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self._plain is self._schema:
            return batch
        arrays = [c.dictionary_decode() if pa.types.is_dictionary(c.type) else c
                  for c in batch.columns]
        return pa.RecordBatch.from_arrays(arrays, schema=self._plain)

    def _encode(self, table: pa.Table) -> pa.Table:
        if self._plain is self._schema:
            return table
        columns = []
        for col, f in zip(table.columns, self._schema):
            if pa.types.is_dictionary(f.type):
                col = pa.chunked_array([pc.dictionary_encode(c).cast(f.type) for c in col.chunks],
                                       f.type)
            columns.append(col)
        return pa.Table.from_arrays(columns, schema=self._schema).unify_dictionaries()

    def write(self, batch: pa.RecordBatch) -> None:
        while batch.num_rows:
            part = batch.slice(0, ROW_GROUP_ROWS - self._rows)
            batch = batch.slice(part.num_rows)
            part = self._decode(part)
            self._parts.append(part)
            self._rows += part.num_rows
            self._bytes += part.nbytes  # the bytes of the rows sliced, not the whole batch's
            if self._rows >= ROW_GROUP_ROWS or self._bytes >= ROW_GROUP_BYTES:
                self._flush()

    def _flush(self) -> None:
        if not self._parts:
            return
        table = self._encode(pa.Table.from_batches(self._parts, schema=self._plain))
        self._writer.write_table(table, row_group_size=max(1, table.num_rows))
        self.rows_written += table.num_rows
        self._parts, self._rows, self._bytes = [], 0, 0

    def close(self) -> None:
        self._flush()
        self._writer.close()

    def abort(self) -> None:
        self._parts = []
        with contextlib.suppress(Exception):  # the file is discarded anyway
            self._writer.close()
