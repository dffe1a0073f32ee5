"""Decoding image bytes into RGB uint8 arrays, what counts as an image file, and the two geometric
helpers (resizing by a factor, a random window) shared by the training-data tools."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import warnings

import numpy as np
from PIL import Image

from collapseguard.errors import CollapseguardError

#: Each file extension (lower case, no dot) treated as an image, with the Pillow format its bytes
#: are expected in (they are decoded by content, within ``ALLOWED_FORMATS``, whatever the name
#: says). The one list of what counts as an image file, in folders and as shard members; an
#: extension whose format this Pillow cannot decode (AVIF before Pillow 11.2; HEIF without
#: pillow-heif) is left out of ``IMAGE_EXTENSIONS``. ``.jfif``, ``.jpe``, ``.pjpeg`` and ``.pjp``
#: are JPEG under other names; ``.heic``, ``.heif`` and ``.hif`` (iPhone and camera photos) are
#: HEIF, read by the pillow-heif plugin where it is installed (the ``[heic]`` extra, Python 3.11+).
EXTENSION_FORMATS = (
    ("png", "PNG"), ("jpg", "JPEG"), ("jpeg", "JPEG"), ("webp", "WEBP"), ("bmp", "BMP"),
    ("tif", "TIFF"), ("tiff", "TIFF"), ("ppm", "PPM"), ("pgm", "PPM"), ("gif", "GIF"),
    ("jpe", "JPEG"), ("jfif", "JPEG"), ("pjpeg", "JPEG"), ("pjp", "JPEG"), ("avif", "AVIF"),
    ("apng", "PNG"), ("pbm", "PPM"), ("pnm", "PPM"), ("heic", "HEIF"), ("heif", "HEIF"),
    ("hif", "HEIF"),
)

#: the extensions of HEIF files
HEIF_EXTENSIONS = tuple(ext for ext, fmt in EXTENSION_FORMATS if fmt == "HEIF")


def heif_install() -> str:
    """What reads HEIF files where pillow-heif is not installed, on the running Python: the
    ``[heic]`` extra from Python 3.11 on; before it, where the extra installs nothing (pillow-heif
    1.9 needs Python 3.11), a newer Python."""
    if sys.version_info < (3, 11):
        return "HEIC needs Python 3.11 or later (pillow-heif 1.9)"
    return "pip install 'collapseguard[heic]'"

#: the major brands (ISO/IEC 23008-12) of the HEIF files pillow-heif opens: HEVC-coded images and
#: sequences, and the generic image and sequence brands (``mif1``, ``msf1``: AVIF is tried first)
_HEIF_BRANDS = (b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"hevm", b"hevs", b"mif1",
                b"msf1")


def _heif_installed() -> bool:
    """Is pillow-heif installed? Found, not imported: it is imported with the first HEIF file
    opened (``_open_heif``)."""
    import importlib.util

    try:
        return importlib.util.find_spec("pillow_heif") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules holds no module spec for it
        return False


def _pillow_decodes(fmt: str) -> bool:
    """Can this Pillow decode ``fmt``? AVIF (a plugin of Pillow 11.2 and later, built with
    libavif) and HEIF (the pillow-heif plugin) are optional; the others are Pillow's own."""
    if fmt == "HEIF":
        return _heif_installed()
    if fmt != "AVIF":
        return True
    try:
        from PIL import features
        return "avif" in features.modules and bool(features.check_module("avif"))
    except Exception:  # noqa: BLE001 - an older or partial Pillow: no AVIF
        return False


#: File extensions (lower case, no dot) treated as images, in order of preference.
IMAGE_EXTENSIONS = tuple(ext for ext, fmt in EXTENSION_FORMATS if _pillow_decodes(fmt))

#: Refuse to decode images larger than this many pixels (decompression bombs). Pillow's own
#: ``DecompressionBombWarning`` (above ``Image.MAX_IMAGE_PIXELS``, 89.5 million by default) is
#: advisory and ignored: a 100-megapixel photo is a real image. This limit lies under Pillow's
#: ``DecompressionBombError`` (twice that) so that, with Pillow's defaults, it is the one that holds.
MAX_PIXELS = 128_000_000

#: The Pillow formats bytes may be decoded as, whatever their name says: those of
#: ``IMAGE_EXTENSIONS`` (PGM is Pillow's PPM plugin; the JPEG plugin also opens MPO). Left to
#: itself Pillow picks a plugin from the content, and some (EPS) run external programs on the data.
ALLOWED_FORMATS = tuple(dict.fromkeys(fmt for ext, fmt in EXTENSION_FORMATS if ext in IMAGE_EXTENSIONS))


def _is_heif(prefix: bytes) -> bool:
    """Do these first bytes begin a HEIF file pillow-heif opens (an ISO media ``ftyp`` box with a
    HEIF major brand)?"""
    return prefix[4:8] == b"ftyp" and prefix[8:12] in _HEIF_BRANDS


def _heif_decode_threads(current: int) -> dict:
    """pillow-heif's decoding threads as ``register_heif_opener`` takes them: ``current`` (its
    ``pillow_heif.options.DECODE_THREADS``, 4 by default) capped to the process's thread budget
    (``OMP_NUM_THREADS``, which a worker's ``set_thread_budget`` sets); nothing where the process
    has no budget."""
    try:
        budget = max(1, int(os.environ["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        return {}
    return {"decode_threads": min(budget, int(current))}


def _open_heif(fp, filename):
    """Pillow's opener of HEIF files until the first one is opened: it imports pillow-heif,
    registers pillow-heif's own opener in its place (once, in each process, and for the whole
    process: its other users of Pillow read HEIF from then on) and opens the file with it.
    pillow-heif (and its libheif) is loaded only by a process that meets a HEIF file; its decoding
    threads are capped to the process's thread budget (``_heif_decode_threads``)."""
    try:
        import pillow_heif

        pillow_heif.register_heif_opener(**_heif_decode_threads(pillow_heif.options.DECODE_THREADS))
    except Exception as exc:  # noqa: BLE001 - a broken install: said for each HEIF file
        raise DecodeError(f"a HEIF image, and pillow-heif does not import ({type(exc).__name__}: "
                          f"{exc}): {heif_install()}") from None
    factory, accept = Image.OPEN["HEIF"]
    fp.seek(0)
    if accept and not accept(fp.read(16)):
        raise SyntaxError("not a HEIF file pillow-heif opens")
    fp.seek(0)
    return factory(fp, filename)


if "HEIF" in ALLOWED_FORMATS and "HEIF" not in Image.OPEN:  # pillow-heif's own, if registered, is kept
    Image.register_open("HEIF", _open_heif, _is_heif)

#: the colour transparent pixels are composited over before anything sees them (scoring,
#: galleries): mid-grey, on which neither light nor dark content vanishes. Over white, a white
#: watermark or a light overlay on a transparent canvas becomes a flat white field, and every such
#: image scores as that field does; mid-grey keeps its edges. Scores carry ``has_alpha`` so such
#: images can be told apart (a mostly transparent image holds little picture to judge).
ALPHA_BACKGROUND = (128, 128, 128)

_OBJECT_REPR = re.compile(r"\s*<[^<>]* object at 0x[0-9a-fA-F]+>")


class DecodeError(CollapseguardError, ValueError):
    """Raised when bytes cannot be decoded into an image. ``size`` is its (width, height) where
    the header was read (an image over the pixel limit), else None."""

    def __init__(self, message: str, size: tuple[int, int] | None = None):
        super().__init__(message)
        self.size = size


def is_image_name(name: str) -> bool:
    """True when a file or tar member name ends with an image extension."""
    ext = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    return ext in IMAGE_EXTENSIONS


def heif_hint(names) -> str:
    """How to read the HEIC/HEIF files among ``names`` (file names, or extensions with their dot)
    where pillow-heif is not installed: ``"to read .heic files: pip install 'collapseguard[heic]'"``
    (``heif_install``); "" where it is, or where none of ``names`` is one."""
    if "HEIF" in ALLOWED_FORMATS:
        return ""
    found = {str(n).rsplit(".", 1)[-1].lower() for n in names if "." in str(n)}
    exts = [f".{e}" for e in HEIF_EXTENSIONS if e in found]
    return f"to read {', '.join(exts)} files: {heif_install()}" if exts else ""


def to_rgb_array(img: Image.Image) -> np.ndarray:
    """Convert a PIL image of any mode to an (H, W, 3) uint8 array.

    Transparency (an alpha channel, or a palette's or tRNS transparent colour) is composited over
    ``ALPHA_BACKGROUND``; 16-bit and float images are scaled to 8 bits. A 16-bit image
    is scaled by its format's full range (65535), never by its own values: a dark 16-bit
    photograph stays dark. Only a 32-bit integer image (mode ``I`` from TIFF), whose range the
    mode does not say, is read as 8-bit when no value exceeds 255.
    """
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        arr = np.asarray(img, dtype=np.float64)
        sixteen = img.mode != "I" or (img.format or "").upper() in ("PNG", "PPM")
        hi = 65535.0 if sixteen or arr.max() > 255 else 255.0
        arr = np.clip(arr / hi * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return np.repeat(arr[..., None], 3, axis=2)
    if img.mode == "F":
        arr = np.asarray(img, dtype=np.float64)
        arr = np.clip(arr * (255.0 if arr.max() <= 1.0 else 1.0) + 0.5, 0, 255).astype(np.uint8)
        return np.repeat(arr[..., None], 3, axis=2)
    if _transparent_mode(img):
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (*ALPHA_BACKGROUND, 255))
        img = Image.alpha_composite(bg, rgba)
    if img.mode != "RGB":
        img = img.convert("RGB")
    return np.ascontiguousarray(np.asarray(img, dtype=np.uint8))


def _transparent_mode(img: Image.Image) -> bool:
    """Can ``img`` hold transparent pixels (an alpha channel or a transparent colour)?"""
    return img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        img.mode in ("P", "L", "RGB") and "transparency" in img.info)


def has_alpha(img: Image.Image) -> bool:
    """Is some pixel of ``img`` not fully opaque? (An alpha channel that is opaque everywhere
    changes nothing and does not count.)"""
    if not _transparent_mode(img):
        return False
    return img.convert("RGBA").getchannel("A").getextrema()[0] < 255


def rgba_composite(arr: np.ndarray) -> np.ndarray:
    """An (H, W, 4) uint8 RGBA array composited over ``ALPHA_BACKGROUND``, as a decoded RGBA file
    is (``to_rgb_array``): the same picture scores the same from a file and from an array."""
    return to_rgb_array(Image.fromarray(np.ascontiguousarray(arr), "RGBA"))


def decode_image(data: bytes) -> np.ndarray:
    """Decode encoded image bytes into an (H, W, 3) uint8 RGB array at native resolution.

    Raises DecodeError with a readable message for anything that is not a decodable image.
    """
    return decode_with_storage(data)[0]


def decode_with_storage(data: bytes) -> tuple[np.ndarray, str]:
    """``decode_image`` and ``image_storage`` from one opening of the bytes."""
    arr, storage, _ = decode_detailed(data)
    return arr, storage


def decode_detailed(data: bytes, keep_alpha: bool = False) -> tuple[np.ndarray, str, bool]:
    """``decode_image``, ``image_storage`` and ``has_alpha`` from one opening of the bytes (what
    scoring uses). With ``keep_alpha``, an image with transparent pixels comes as an (H, W, 4)
    RGBA array instead of its composite (what a gallery shows on a checkerboard)."""
    return _decode(data, keep_alpha)[:3]


def decode_reduced(data: bytes, min_side: int) -> tuple[np.ndarray, str, bool, tuple[int, int]]:
    """``decode_detailed``, but a JPEG (RGB or grey) comes as its luma (BT.601 Y, an (H', W')
    uint8 array) decoded at 1/2, 1/4 or 1/8 scale (DCT scaling: ``Image.draft``), the smallest
    whose short side is still ``min_side`` or more; other formats as ``decode_detailed`` gives
    them. Also returns the (height, width) of the full image as shown. The same checks and errors
    as ``decode_detailed``; for what needs only a small picture (``detectors.fingerprint``)."""
    return _decode(data, False, min_side)


def _decode(data: bytes, keep_alpha: bool, draft_side: int | None = None
            ) -> tuple[np.ndarray, str, bool, tuple[int, int]]:
    if not len(data):  # said as it is, not as Pillow's "cannot identify image file"
        raise DecodeError("empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS) as img:
                w, h = img.size
                if w * h > MAX_PIXELS:
                    raise DecodeError(f"image too large: {w}x{h} pixels, over the {MAX_PIXELS:,}-pixel "
                                      "limit", size=(w, h))
                storage = _storage(img)
                if draft_side and img.format == "JPEG" and img.mode in ("RGB", "L") \
                        and "transparency" not in img.info:
                    img.draft("L", (draft_side, draft_side))
                    img.load()
                    orientation = _orientation(img)
                    full = (h, w) if orientation < 5 else (w, h)
                    arr = np.asarray(img.convert("L") if img.mode != "L" else img, dtype=np.uint8)
                    return _apply_orientation(arr, orientation), storage, False, full
                img.load()
                if storage == "png" and _maybe_cut_short(img):
                    short = png_data_short(data)
                    if short:
                        raise DecodeError(short)
                alpha = has_alpha(img)
                arr = (np.asarray(img.convert("RGBA"), dtype=np.uint8) if keep_alpha and alpha
                       else to_rgb_array(img))
                arr = _apply_orientation(arr, _orientation(img))
                return arr, storage, alpha, arr.shape[:2]
    except DecodeError:
        raise
    except Image.DecompressionBombError as exc:  # Pillow's own refusal, at twice its limit
        n = re.search(r"\((\d+) pixels\)", str(exc))
        size = f"{int(n.group(1)):,} pixels" if n else "more pixels than Pillow opens"
        raise DecodeError(f"image too large: {size}, over the {MAX_PIXELS:,}-pixel limit",
                          size=_header_size(data)) from None
    except Exception as exc:  # PIL raises many types for bad data
        # no memory addresses ("<_io.BytesIO object at 0x7f...>"): the same bytes give the same text
        text = _OBJECT_REPR.sub("", f"{type(exc).__name__}: {exc}")
        if "HEIF" not in ALLOWED_FORMATS and _is_heif(data[:16]):  # a HEIC under another name
            text += f" (a HEIF image; to read it: {heif_install()})"
        raise DecodeError(text) from None


def _header_size(data: bytes) -> tuple[int, int] | None:
    """The (width, height) the header of ``data`` claims, read by the plugin of an allowed format
    that takes it, without Pillow's pixel-count check: ``Image.open`` raises its
    ``DecompressionBombError`` before the size can be asked, and a refused image's row carries its
    size as one refused against ``MAX_PIXELS`` does. Nothing is decoded; None when no plugin
    reads the header."""
    Image.init()
    for fmt in ALLOWED_FORMATS:
        factory, accept = Image.OPEN.get(fmt, (None, None))
        try:
            if factory is None or (accept and not accept(data[:16])):
                continue
            with factory(io.BytesIO(data)) as img:
                return img.size
        except Exception:  # noqa: BLE001 - PIL raises many types for bad data: not this format
            continue
    return None


def shown_rgb_array(img: Image.Image) -> np.ndarray:
    """An opened PIL image as the (H, W, 3) uint8 array its file decodes to: ``to_rgb_array``,
    turned as its EXIF orientation says it is shown (``decode_image`` does the same)."""
    return np.ascontiguousarray(_apply_orientation(to_rgb_array(img), _orientation(img)))


def _orientation(img: Image.Image) -> int:
    """The EXIF orientation tag (1-8) of an opened image; 1 (as stored) when absent or unreadable."""
    try:
        value = int(img.getexif().get(0x0112, 1))
    except Exception:  # a broken EXIF block must not make the pixels undecodable
        return 1
    return value if 1 <= value <= 8 else 1


def _apply_orientation(arr: np.ndarray, orientation: int) -> np.ndarray:
    """``arr`` turned the way the EXIF orientation says it is shown (as ``ImageOps.exif_transpose``
    does): a camera's portrait JPEG is stored sideways with orientation 6 or 8, and every viewer,
    the audit's galleries and a VLM judge must see it upright."""
    if orientation == 1:
        return arr
    ops = {
        2: lambda a: a[:, ::-1],
        3: lambda a: a[::-1, ::-1],
        4: lambda a: a[::-1],
        5: lambda a: a.swapaxes(0, 1),
        6: lambda a: np.rot90(a, -1),
        7: lambda a: a[::-1, ::-1].swapaxes(0, 1),
        8: lambda a: np.rot90(a, 1),
    }
    return np.ascontiguousarray(ops[orientation](arr))


def _maybe_cut_short(img: Image.Image) -> bool:
    """Cheap screen for ``png_data_short``: Pillow leaves the pixels of PNG rows it never received
    zero, and however the data ends some of them lie in the last two rows (the last row of a plain
    PNG; Adam7 fills the odd rows last). No zero there, nothing missing."""
    w, h = img.size
    tail = np.asarray(img.crop((0, max(0, h - 2), w, h)))
    if tail.ndim == 3:
        return bool((tail == 0).all(axis=2).any())
    return bool((tail == 0).any())


#: Adam7 passes: (first row, first column, row step, column step)
_ADAM7 = ((0, 0, 8, 8), (0, 4, 8, 8), (4, 0, 8, 4), (0, 2, 4, 4), (2, 0, 4, 2), (0, 1, 2, 2), (1, 0, 2, 1))
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def png_data_short(data: bytes) -> str | None:
    """Why a PNG's image data holds fewer rows than its header promises, or None when it holds
    them all (or the file is not a PNG this can read). Pillow accepts such a file without error
    when its compressed stream is complete but short (a writer that stopped early), and paints the
    missing rows black; this counts the bytes the stream inflates to."""
    import struct
    import zlib

    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR" or len(data) < 33:
        return None
    w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", data[16:29])
    channels = _PNG_CHANNELS.get(colour)
    if channels is None:
        return None

    def row_bytes(width: int) -> int:
        return 1 + (width * channels * depth + 7) // 8  # the filter byte, then the packed pixels

    if interlace:
        need = 0
        for y0, x0, dy, dx in _ADAM7:
            pw, ph = (w - x0 + dx - 1) // dx if w > x0 else 0, (h - y0 + dy - 1) // dy if h > y0 else 0
            need += ph * row_bytes(pw) if pw and ph else 0
    else:
        need = h * row_bytes(w)
    inflate, got, i = zlib.decompressobj(), 0, 8
    while i + 8 <= len(data) and got < need:
        n, kind = struct.unpack(">I", data[i:i + 4])[0], data[i + 4:i + 8]
        if kind == b"IDAT":
            try:
                got += len(inflate.decompress(data[i + 8:i + 8 + n], need - got))
            except zlib.error:
                return None  # Pillow decoded it; not this check's business
            while inflate.unconsumed_tail and got < need:
                got += len(inflate.decompress(inflate.unconsumed_tail, need - got))
        elif kind == b"IEND":
            break
        i += 12 + n
    if got >= need:
        return None
    return f"PNG image data ends early: {got} of {need} bytes ({w}x{h}), the rest would be black"


#: Pillow's JPEG chroma-subsampling codes (``JpegImagePlugin.get_sampling``)
_JPEG_SAMPLING = {0: "4:4:4", 1: "4:2:2", 2: "4:2:0"}


@contextlib.contextmanager
def _open_header(data: bytes):
    """The image opened for its header alone, without Pillow's ``DecompressionBombWarning`` (the
    size is judged where the pixels are decoded, against ``MAX_PIXELS``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS) as img:
            yield img


def image_storage(data: bytes) -> str:
    """How encoded image bytes store their pixels, read from the header alone (nothing decoded).

    The format in lower case (``"png"``, ``"webp"``, ...); for JPEG also the chroma subsampling:
    ``"jpeg 4:2:0"`` (what most cameras and Pillow write), ``"jpeg 4:4:4"``, ``"jpeg 4:2:2"``,
    ``"jpeg gray"``, or plain ``"jpeg"`` for other layouts. ``""`` when the header is unreadable.
    It matters because 4:2:0 averages colour over 2x2 pixels, which erases much of the colour in
    static noise: the cnn catches less noise damage in such files (MODEL_CARD.md, "JPEG storage
    and chroma subsampling").
    """
    try:
        with _open_header(data) as img:
            return _storage(img)
    except Exception:  # PIL raises many types for bad data; decoding reports the error
        return ""


def _storage(img: Image.Image) -> str:
    """``image_storage`` of an opened (not necessarily loaded) image."""
    fmt = (img.format or "").lower()
    if fmt not in ("jpeg", "mpo"):  # MPO: a camera's multi-picture JPEG
        return fmt
    if img.mode == "L":
        return "jpeg gray"
    from PIL import JpegImagePlugin

    sub = _JPEG_SAMPLING.get(JpegImagePlugin.get_sampling(img))
    return f"jpeg {sub}" if sub else "jpeg"


#: the IJG (libjpeg) example luminance quantization table (ITU-T T.81 Annex K), natural order
_IJG_LUMA = (16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55,
             14, 13, 16, 24, 40, 57, 69, 56, 14, 17, 22, 29, 51, 87, 80, 62,
             18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
             49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99)


def _ijg_luma_table(quality: int) -> tuple[int, ...]:
    """The luminance table libjpeg writes for ``quality`` (1-100), baseline-clamped to 1-255."""
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    return tuple(min(255, max(1, (v * scale + 50) // 100)) for v in _IJG_LUMA)


_IJG_QUALITY = {}
for _q in range(1, 101):  # a table that two qualities share keeps the higher quality
    _IJG_QUALITY[_ijg_luma_table(_q)] = _q


def jpeg_quality(img: Image.Image) -> int | None:
    """The libjpeg quality (1-100) whose luminance table an opened JPEG carries, or None when its
    table is not one libjpeg's quality scaling makes (another encoder, a custom table). libjpeg and
    everything built on it (Pillow, ImageMagick, img2dataset, most cameras' software) write these."""
    try:
        table = tuple(int(v) for v in img.quantization[0])
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    return _IJG_QUALITY.get(table)


def storage_label(data: bytes) -> str:
    """``image_storage`` with what the header tells beyond the format, for per-storage reports:
    ``"jpeg q90 4:2:0"`` when the luminance table is libjpeg's for a quality (``jpeg_quality``),
    ``"webp lossless"`` for VP8L WebP (lossy WebP stays ``"webp"``: its quality is not stored).
    ``""`` when the header is unreadable."""
    try:
        with _open_header(data) as img:
            base = _storage(img)
            if base.startswith("jpeg"):
                q = jpeg_quality(img)
                if q is not None:
                    return "jpeg" + f" q{q}" + base[4:]
            elif base == "webp" and b"VP8L" in data[12:4096] and b"VP8 " not in data[12:4096]:
                return "webp lossless"
            return base
    except Exception:  # PIL raises many types for bad data; decoding reports the error
        return ""


def load_image(path) -> np.ndarray:
    """Read and decode an image file (see decode_image); a DecodeError names the file."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return decode_image(data)
    except DecodeError as exc:
        raise DecodeError(f"{path}: {exc}") from None


def encode_png(arr: np.ndarray) -> bytes:
    """Losslessly encode an (H, W, 3) uint8 array as PNG bytes."""
    buf = io.BytesIO()
    Image.fromarray(np.asarray(arr, dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def encode_jpeg(arr: np.ndarray, quality: int = 90, subsampling: int | None = None) -> bytes:
    """Encode an (H, W, 3) uint8 array as JPEG bytes. ``subsampling``: Pillow's code (0 = 4:4:4,
    1 = 4:2:2, 2 = 4:2:0); None keeps Pillow's default, 4:2:0 at every quality, as most cameras
    and web images store colour."""
    buf = io.BytesIO()
    extra = {} if subsampling is None else {"subsampling": int(subsampling)}
    Image.fromarray(np.asarray(arr, dtype=np.uint8)).save(buf, format="JPEG", quality=int(quality), **extra)
    return buf.getvalue()


def resize_by(img: np.ndarray, scale: float) -> np.ndarray:
    """Resize by ``scale`` (sides at least 8 px): bicubic up, Lanczos down (``reducing_gap=3``)."""
    h, w = img.shape[:2]
    nh, nw = max(8, round(h * scale)), max(8, round(w * scale))
    if scale > 1:
        return np.asarray(Image.fromarray(img).resize((nw, nh), Image.BICUBIC))
    return np.asarray(Image.fromarray(img).resize((nw, nh), Image.LANCZOS, reducing_gap=3.0))


def random_window(img: np.ndarray, side: int, rng: np.random.Generator) -> np.ndarray:
    """A ``side`` x ``side`` window at a random place (the whole image when smaller): draws y, then x."""
    h, w = img.shape[:2]
    y = int(rng.integers(0, max(1, h - side + 1)))
    x = int(rng.integers(0, max(1, w - side + 1)))
    return img[y : y + side, x : x + side]
