"""Detectors and image decoding on the inputs users actually have: 16-bit and EXIF-rotated files,
devices that are not there, and detector specs typed by hand."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from collapseguard.detectors import DetectorError, create
from collapseguard.images import decode_image


def _png16(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr.astype(np.uint16)).save(buf, format="PNG")
    return buf.getvalue()


def test_a_dark_16bit_png_stays_dark():
    ramp = np.linspace(0, 1, 40 * 50).reshape(40, 50)
    bright = decode_image(_png16(ramp * 60000))
    dark = decode_image(_png16(ramp * 200))  # a night sky: every value far below full scale
    assert Image.open(io.BytesIO(_png16(ramp * 200))).mode.startswith("I")
    assert bright.max() == round(60000 / 65535 * 255)
    assert dark.max() <= 1  # 200 / 65535 of full scale, not stretched to look like 8-bit data
    # the same for a 16-bit PGM (Pillow: mode I, scaled to 65535 from its maxval)
    pgm = b"P5\n4 1\n65535\n" + np.array([0, 100, 200, 255], dtype=">u2").tobytes()
    assert decode_image(pgm)[0, :, 0].tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_exif_orientation_is_applied_as_viewers_do(orientation, fmt):
    from skimage import data

    img = Image.fromarray(data.astronaut()[100:160, 150:240])  # 60 x 90, not square
    exif = img.getexif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    img.save(buf, format=fmt, exif=exif.tobytes())
    expected = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(buf.getvalue()))).convert("RGB"))
    got = decode_image(buf.getvalue())
    assert got.shape == expected.shape and np.array_equal(got, expected)
    if orientation in (5, 6, 7, 8):  # a portrait photo stored sideways is scored upright
        assert got.shape[:2] == (90, 60)


no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


@no_cuda
def test_pillows_advisory_pixel_limit_does_not_refuse_a_real_image(monkeypatch):
    """Pillow warns above ``Image.MAX_IMAGE_PIXELS`` (89.5 million by default: a 100-megapixel photo
    is over it) and refuses above twice that; only collapseguard's own ``MAX_PIXELS`` refuses."""
    from collapseguard.images import DecodeError

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # the default, scaled down
    buf = io.BytesIO()
    Image.fromarray(np.full((40, 40, 3), 90, np.uint8)).save(buf, format="JPEG")  # 1,600 pixels
    assert decode_image(buf.getvalue()).shape == (40, 40, 3)
    buf = io.BytesIO()
    Image.fromarray(np.full((50, 50, 3), 90, np.uint8)).save(buf, format="PNG")  # over twice the limit
    with pytest.raises(DecodeError, match="image too large: 2,500 pixels, over the 128,000,000-pixel limit"):
        decode_image(buf.getvalue())


def _png_header(w: int, h: int) -> bytes:
    """A PNG signature, an IHDR claiming ``w`` x ``h`` grey pixels and IEND: a header, no pixels."""
    import struct
    import zlib

    def chunk(t: bytes, d: bytes) -> bytes:
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)) + chunk(b"IEND", b"")


def test_a_header_claiming_too_many_pixels_is_refused_against_our_limit_and_read_without_warning():
    """The error states collapseguard's limit, also where Pillow refuses first (60000x60000), and
    reading a large image's storage from its header (what calibrate does for every clean image)
    raises no DecompressionBombWarning."""
    import warnings

    from collapseguard.images import DecodeError, image_storage, storage_label

    with pytest.raises(DecodeError, match="image too large: 3,600,000,000 pixels, over the 128,000,000-pixel limit"):
        decode_image(_png_header(60000, 60000))
    with pytest.raises(DecodeError, match="12000x12000 pixels, over the 128,000,000-pixel limit"):
        decode_image(_png_header(12000, 12000))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 108 million pixels: over Pillow's warning level
        assert storage_label(_png_header(12000, 9000)) == "png" == image_storage(_png_header(12000, 9000))


def test_an_absent_gpu_is_a_detector_error_not_a_traceback():
    with pytest.raises(DetectorError, match="CUDA is not available"):
        create("cnn", device="cuda")
    det = create("cnn")
    with pytest.raises(DetectorError, match="CUDA is not available"):
        det.to("cuda")
    assert det.to("cpu") is det and det.score([np.zeros((60, 60, 3), np.uint8)]).shape == (1,)
    with pytest.raises(DetectorError, match="device"):
        create("cnn", device="gpu")
    ens = create("ens:cnn+nss")
    with pytest.raises(DetectorError, match="CUDA is not available"):
        ens.to("cuda")  # the members do the work: the device must reach them


@no_cuda
def test_an_absent_gpu_is_a_detector_error_for_pyiqa():
    pytest.importorskip("pyiqa")
    with pytest.raises(DetectorError, match="CUDA is not available"):
        create("pyiqa:piqe", device="cuda")
    with pytest.raises(DetectorError, match="CUDA is not available"):
        create("pyiqa:piqe", device="cpu").to("cuda")


def test_the_cli_reports_an_absent_gpu_in_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    from click.testing import CliRunner

    from collapseguard.cli import main
    from collapseguard.images import encode_png

    clean = tmp_path / "clean"
    clean.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        (clean / f"{i}.png").write_bytes(encode_png(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)))
    res = CliRunner().invoke(main, ["calibrate", "--clean", str(clean), "--device", "cuda",
                                    "--out", str(tmp_path / "cal.json")])
    assert res.exit_code != 0 and "CUDA is not available" in res.output
    assert isinstance(res.exception, SystemExit)  # a ClickException's exit, not a traceback


def test_a_spec_with_surrounding_spaces_is_the_same_detector():
    det = create("  nss ")
    assert det.name == "nss" and det.version == create("nss").version
    with pytest.raises(DetectorError, match="non-empty"):
        create("   ")


def test_cnn_weights_with_a_broken_config_are_a_detector_error(tmp_path):
    from collapseguard.detectors.cnn_model import DegradationNet, save_net

    path = tmp_path / "w.safetensors"
    save_net(DegradationNet(), path)
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header["__metadata__"]["config"] = json.dumps([16, 48])  # not an object
    body = json.dumps(header).encode()
    path.write_bytes(len(body).to_bytes(8, "little") + body + raw[8 + n :])
    with pytest.raises(DetectorError, match="cannot load cnn weights"):
        create(f"cnn:{path}")


def test_the_same_weights_are_written_as_the_same_bytes(tmp_path):
    """The safetensors writer orders the header's metadata by a hash map; the metadata keys are
    sorted, so one net saved five times gives one file (a checksum tells identical weights)."""
    import hashlib

    from collapseguard.detectors.cnn_model import DegradationNet, save_net

    torch.manual_seed(0)
    net = DegradationNet()
    meta = {f"key{i}": f"value {i}" for i in range(6)}
    digests = set()
    for i in range(5):
        save_net(net, tmp_path / f"w{i}.safetensors", metadata=meta)
        digests.add(hashlib.sha256((tmp_path / f"w{i}.safetensors").read_bytes()).hexdigest())
    assert len(digests) == 1
    assert create(f"cnn:{tmp_path / 'w0.safetensors'}").version == create(f"cnn:{tmp_path / 'w4.safetensors'}").version


@pytest.mark.parametrize("spec", ["cnn", "nss"])
def test_one_image_on_its_own_is_refused_and_rgba_arrays_score_as_their_files(spec, photos):
    det = create(spec)
    img = photos[0][:96, :128]
    with pytest.raises(TypeError, match=r"pass \[image\]"):
        det.score(img)  # iterated, it would be 96 "images" of one row each
    with pytest.raises(TypeError, match=r"pass \[image\]"):
        det.score_detailed(img[..., 0])
    with pytest.raises(TypeError, match=r"got one Image: pass \[image\]"):
        det.score(Image.fromarray(img))  # not "'Image' object is not iterable"
    with pytest.raises(TypeError, match="got a str; decode files first"):
        det.score(["photo.png"])  # not "expected uint8 pixels, got <U9"
    rgba = np.dstack([img, np.linspace(0, 255, img.shape[1], dtype=np.uint8)[None].repeat(img.shape[0], 0)])
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buf, format="PNG")
    from_file = det.score([decode_image(buf.getvalue())])
    np.testing.assert_allclose(det.score([rgba]), from_file, rtol=1e-5, atol=1e-5)
    assert det.score([rgba])[0] != pytest.approx(float(det.score([img])[0]), abs=1e-3)  # alpha matters
    np.testing.assert_allclose(det.score(np.stack([img, img])), det.score([img, img]), rtol=1e-4, atol=1e-4)


def test_an_animated_image_is_decoded_as_its_first_frame():
    """REFERENCE.md: an animated GIF is judged by its first frame (a noisy second frame is not seen)."""
    rng = np.random.default_rng(0)
    first = Image.fromarray(np.full((32, 32, 3), 120, np.uint8))
    second = Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    anim, still = io.BytesIO(), io.BytesIO()
    first.save(anim, format="GIF", save_all=True, append_images=[second], duration=100)
    first.save(still, format="GIF")
    assert Image.open(io.BytesIO(anim.getvalue())).n_frames == 2
    assert np.array_equal(decode_image(anim.getvalue()), decode_image(still.getvalue()))


@pytest.mark.parametrize("spec", ["nss", "npr", "fixedpoint", "cnn", "compare"])
def test_every_detector_refuses_pixels_it_would_misread_with_one_message(spec):
    """A float image in [0, 1], 16-bit pixels or a channels-first array gave nss five different
    scores for one picture; every detector now refuses them alike, and takes a grey (H, W) or
    (H, W, 1) array or a PIL image as the RGB picture it is."""
    det = create(spec)
    u8 = (np.random.default_rng(0).random((96, 96, 3)) * 255).astype(np.uint8)
    for bad, says in ((u8 / 255.0, "expected uint8 pixels"), (u8.astype(np.uint16) * 257, "expected uint8 pixels"),
                      (u8.transpose(2, 0, 1).copy(), r"expected an \(H, W, 3\) RGB, \(H, W, 4\) RGBA or \(H, W\) grey")):
        with pytest.raises(ValueError, match=says):
            det.score([bad])
    grey = u8[..., 0]
    assert np.allclose(det.score([grey]), det.score([np.repeat(grey[..., None], 3, axis=2)]))
    assert np.allclose(det.score([grey[..., None]]), det.score([grey]))  # (H, W, 1) is grey too
    assert np.allclose(det.score([Image.fromarray(u8)]), det.score([u8]))
    assert len(det.score([])) == 0


@pytest.mark.parametrize("spec", ["nss", "cnn"])
def test_a_pil_image_of_any_mode_scores_as_its_file(spec, photos):
    """A 16-bit, float or palette-with-transparency PIL image is the picture its file is: a plain
    ``convert("RGB")`` clipped 16-bit values to white and dropped the tRNS colour, so an open PIL
    image and the same file scored differently (-4.35 against -1.15 for one 16-bit photo)."""
    det = create(spec)
    grey = np.asarray(Image.fromarray(photos[0][:128, :128]).convert("L"))
    pal = Image.fromarray(photos[0][:128, :128]).convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
    pal.info["transparency"] = int(np.asarray(pal)[0, 0])
    for im, fmt in ((Image.fromarray(grey.astype(np.uint16) * 257), "PNG"),
                    (Image.fromarray(grey.astype(np.float32) / 255), "TIFF"), (pal, "PNG")):
        buf = io.BytesIO()
        im.save(buf, format=fmt)
        np.testing.assert_allclose(det.score([im]), det.score([decode_image(buf.getvalue())]),
                                   rtol=1e-5, atol=1e-5, err_msg=im.mode)
    # a camera's portrait JPEG, stored sideways with EXIF orientation 6: opened with PIL, it is
    # scored upright, as its file is
    side = Image.fromarray(photos[0][:96, :160])
    exif = side.getexif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    side.save(buf, format="JPEG", quality=90, exif=exif.tobytes())
    opened = Image.open(io.BytesIO(buf.getvalue()))
    from_file = det.score([decode_image(buf.getvalue())])
    np.testing.assert_allclose(det.score([opened]), from_file, rtol=1e-5, atol=1e-5)


def test_a_file_that_cannot_be_decoded_is_named_in_the_error(tmp_path):
    """`chains sheet` and `chains store` read chain files with load_image: a truncated one is
    named, not only "image file is truncated"."""
    from collapseguard.images import DecodeError, encode_png, load_image

    png = encode_png(np.full((64, 64, 3), 90, np.uint8))
    bad = tmp_path / "chain" / "step_003.png"
    bad.parent.mkdir()
    bad.write_bytes(png[: len(png) // 2])
    with pytest.raises(DecodeError, match=r"chain/step_003\.png: "):
        load_image(bad)
