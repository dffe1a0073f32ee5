"""A group never loses every copy of its picture: a monochrome copy (greyscale, 1-bit dithered)
never outranks a colour copy, and ``filter --groups`` leaves a group's other copies to their own
decision when it rejects the group's kept copy. Real images, real shards, the shipped comparator
and cnn."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pandas as pd
import pytest
import skimage.data as sd
from cg_testutil import add_member, read_members, run_cli
from PIL import Image, ImageEnhance

from collapseguard.dedup.colour import COLOUR_CHROMA, MONOCHROME_CHROMA, lost_colour


def _enc(im: Image.Image, fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def _shard(path, samples) -> None:
    with tarfile.open(path, "w") as tf:
        for key, ext, data in samples:
            add_member(tf, f"{key}.{ext}", data)
            add_member(tf, f"{key}.txt", key.encode())


def _groups(out) -> pd.DataFrame:
    return pd.read_parquet(out / "groups.parquet").set_index("key")


PHOTOS = ("chelsea", "coffee", "rocket", "astronaut")


def _photo_pairs(src, names, scale: float, resample, orig: str, copy: str) -> None:
    """Each skimage photo of ``names`` in ``src`` as ``NAME{orig}`` and resized by ``scale`` as
    ``NAME{copy}``, both PNG."""
    src.mkdir(parents=True, exist_ok=True)
    for name in names:
        im = Image.fromarray(getattr(sd, name)())
        im.save(src / f"{name}{orig}")
        im.resize((int(im.width * scale), int(im.height * scale)), resample).save(src / f"{name}{copy}")


def test_a_grey_copy_never_outranks_its_colour_original(tmp_path):
    src = tmp_path / "gray"
    src.mkdir()
    for name, arr in (("astro", sd.astronaut()), ("coffee", sd.coffee()), ("chelsea", sd.chelsea())):
        im = Image.fromarray(arr)
        im.save(src / f"{name}_color.png")
        im.convert("L").save(src / f"{name}_gray.png")
    run_cli(["dedup", src, "--out", tmp_path / "dd", "--gallery", "3", "-q"])
    g = _groups(tmp_path / "dd")
    for name in ("astro", "coffee", "chelsea"):
        colour, grey = g.loc[f"{name}_color.png"], g.loc[f"{name}_gray.png"]
        assert colour["group"] and colour["group"] == grey["group"]
        assert (colour["rank"], colour["decision"]) == (0, "keep")
        assert (grey["rank"], grey["decision"], grey["reason"]) == (1, "degraded_copy", "lost_colour")
    # the gallery names the rule: the comparator's own P(worse) may say the grey copy is better
    assert (tmp_path / "dd" / "groups.html").read_text().count("degraded_copy (lost_colour)") == 3


def test_a_tinted_copy_of_a_grey_original_does_not_outrank_it(tmp_path):
    """The reverse case: a grey picture whose re-renders took a green cast (the study's tint, +6
    and +15 levels). A uniform cast is not colour: the originals are not ``lost_colour``, the
    comparator ranks the group, and ``filter --groups`` keeps the originals."""
    samples = []
    for name in ("camera", "moon"):
        g = np.asarray(Image.fromarray(getattr(sd, name)()).resize((384, 384)))
        samples.append((name, "png", _enc(Image.fromarray(g).convert("RGB"), "PNG")))
        for shift in (6, 15):
            rgb = np.stack([g, g, g], -1).astype(float)
            rgb[..., 1] += shift
            rgb[..., [0, 2]] -= shift / 2
            samples.append((f"{name}_green{shift}", "png", _enc(Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)), "PNG")))
    _shard(tmp_path / "tint.tar", samples)
    run_cli(["dedup", tmp_path / "tint.tar", "--out", tmp_path / "dd", "-q"])
    g = _groups(tmp_path / "dd")
    assert "lost_colour" not in set(g["reason"])
    for name in ("camera", "moon"):
        assert g.loc[name, "group"] and (g.loc[name, "rank"], g.loc[name, "decision"]) == (0, "keep")
    out = tmp_path / "f"
    run_cli(["filter", tmp_path / "tint.tar", "--out", out, "--groups", tmp_path / "dd" / "groups.parquet", "-q"])
    kept = {n for n, _ in read_members(out / "kept" / "tint.tar")}
    assert {"camera.png", "moon.png"} <= kept


def test_a_noisy_copy_of_a_grey_original_does_not_outrank_it(tmp_path):
    """Chroma noise on a grey picture (independent noise of 8 levels on each channel) is no colour:
    averaged over 16 px it is gone, so the originals are not ``lost_colour``, the comparator ranks
    each group (the noisy copy the worse), and ``filter --groups`` keeps the originals. At the
    scale the group is compared at, the noise read as colour and the originals lost to it."""
    from collapseguard.detectors.pair_features import coarse_chroma

    rng = np.random.default_rng(5)
    samples = []
    for name in ("camera", "moon", "coins"):
        g = np.stack([getattr(sd, name)()] * 3, -1)
        noisy = np.clip(g + rng.normal(0, 8, g.shape), 0, 255).astype(np.uint8)
        sat, cast = coarse_chroma(noisy)
        assert sat < COLOUR_CHROMA and cast < MONOCHROME_CHROMA, (name, sat, cast)
        samples += [(name, "png", _enc(Image.fromarray(g), "PNG")),
                    (f"{name}_noisy", "png", _enc(Image.fromarray(noisy), "PNG"))]
    _shard(tmp_path / "noisy.tar", samples)
    run_cli(["dedup", tmp_path / "noisy.tar", "--out", tmp_path / "dd", "-q"])
    g = _groups(tmp_path / "dd")
    assert "lost_colour" not in set(g["reason"]), g[["rank", "decision", "reason"]]
    for name in ("camera", "moon", "coins"):
        assert g.loc[name, "group"] == g.loc[f"{name}_noisy", "group"] != ""
        assert (g.loc[name, "rank"], g.loc[name, "decision"]) == (0, "keep")
    out = tmp_path / "f"
    run_cli(["filter", tmp_path / "noisy.tar", "--out", out, "--groups", tmp_path / "dd" / "groups.parquet",
             "--drop-duplicates", "-q"])
    assert {n for n, _ in read_members(out / "kept" / "noisy.tar")} >= {"camera.png", "moon.png", "coins.png"}


@pytest.fixture(scope="module")
def bw_shard(tmp_path_factory):
    """A colour JPEG and two 1-bit dithered copies of it (which the shipped cnn rejects)."""
    root = tmp_path_factory.mktemp("bw")
    astro = Image.fromarray(sd.astronaut()).resize((256, 256))
    _shard(root / "bw-000.tar", [("orig", "jpg", _enc(astro, "JPEG", quality=92)),
                                 ("bw1", "png", _enc(astro.convert("1"), "PNG")),
                                 ("bw2", "png", _enc(astro.convert("1"), "PNG"))])
    run_cli(["dedup", root / "bw-000.tar", "--out", root / "dd", "-q"])
    return root


def test_a_1bit_copy_never_outranks_its_colour_original_and_the_picture_survives(bw_shard, tmp_path):
    g = _groups(bw_shard / "dd")
    assert (g.loc["orig", "rank"], g.loc["orig", "decision"]) == (0, "keep")
    for k in ("bw1", "bw2"):
        assert g.loc[k, "rank"] > 0 and (g.loc[k, "decision"], g.loc[k, "reason"]) == ("degraded_copy", "lost_colour")
    out = tmp_path / "f"
    run_cli(["filter", bw_shard / "bw-000.tar", "--out", out, "--groups", bw_shard / "dd" / "groups.parquet", "-q"])
    scores = pd.read_parquet(out / "scores" / "bw-000.parquet").set_index("key")
    assert (scores.loc["orig", "decision"], scores.loc["orig", "reason"]) == ("kept", "kept")
    assert {n for n, _ in read_members(out / "kept" / "bw-000.tar")} == {"orig.jpg", "orig.txt"}


def test_slightly_desaturated_copies_and_grey_only_groups_are_left_to_the_comparator():
    for name in ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field"):
        im = Image.fromarray(getattr(sd, name)()[..., :3])
        from collapseguard.detectors.pair_features import features_at, reduce_to
        from collapseguard.images import decode_image

        def chroma(data):
            return features_at(reduce_to(decode_image(data), 64), frozenset({"sat"}))[6]
        colour = [chroma(_enc(im, "PNG")), chroma(_enc(im, "JPEG", quality=40)),
                  chroma(_enc(ImageEnhance.Color(im).enhance(0.7), "JPEG", quality=75))]
        grey = [chroma(_enc(im.convert("L"), "PNG")), chroma(_enc(im.convert("1"), "PNG")),
                chroma(_enc(im.convert("L").convert("RGB"), "JPEG", quality=60))]
        assert not lost_colour(np.array(colour)).any(), (name, colour)  # JPEG, 70% saturation
        assert grey == [0.0, 0.0, 0.0] and min(colour) > MONOCHROME_CHROMA
        faint = max(colour) <= COLOUR_CHROMA  # hubble_deep_field: too faint to call colour
        assert faint == (name == "hubble_deep_field"), (name, colour)
        want = [False] * 3 + [not faint] * 3
        assert lost_colour(np.array(colour + grey)).tolist() == want, (name, colour, grey)
        assert not lost_colour(np.array(grey)).any()  # only grey copies: the comparator decides


@pytest.fixture(scope="module")
def three_copies(tmp_path_factory):
    """Three copies of one photo (PNG, a 384 px JPEG q90, a 256 px JPEG q70) in one shard, and
    dedup's table: it keeps the full-size PNG, which the cnn scores higher than the reductions."""
    root = tmp_path_factory.mktemp("three")
    astro = Image.fromarray(sd.astronaut())
    _shard(root / "00000.tar", [("png", "png", _enc(astro, "PNG")),
                                ("q90", "jpg", _enc(astro.resize((384, 384)), "JPEG", quality=90)),
                                ("small", "jpg", _enc(astro.resize((256, 256)), "JPEG", quality=70))])
    run_cli(["dedup", root / "00000.tar", "--out", root / "dd", "-q"])
    return root


def test_a_group_whose_kept_copy_is_rejected_leaves_its_copies_to_their_own_decision(three_copies, tmp_path):
    root = three_copies
    g = _groups(root / "dd")
    kept = g[g["rank"] == 0].index[0]
    assert g["group"].nunique() == 1 and g["kept_detector"].iloc[0].startswith("cnn@")
    plain = tmp_path / "plain"  # the no-reference scores alone
    run_cli(["filter", root / "00000.tar", "--out", plain, "--threshold", "100", "-q"])
    score = pd.read_parquet(plain / "scores" / "00000.parquet").set_index("key")["score"]
    assert g["kept_score"].tolist() == pytest.approx([score[kept]] * 3, abs=1e-4)
    below = [k for k in g.index if k != kept and score[k] < score[kept] - 1e-3]
    assert below, score  # a copy the cnn likes better than the comparator's kept one
    threshold = (max(score[k] for k in below) + score[kept]) / 2  # rejects the kept copy only
    out = tmp_path / "f"
    run_cli(["filter", root / "00000.tar", "--out", out, "--groups", root / "dd" / "groups.parquet",
             "--drop-duplicates", "--threshold", f"{threshold:.6f}", "-q"])
    got = pd.read_parquet(out / "scores" / "00000.parquet").set_index("key")
    assert (got.loc[kept, "decision"], got.loc[kept, "reason"]) == ("rejected", "degraded")
    for k in g.index.drop(kept):  # each copy as the no-reference decision alone decides it
        own = ("kept", "kept") if score[k] <= threshold else ("rejected", "degraded")
        assert (got.loc[k, "decision"], got.loc[k, "reason"]) == own, k
    assert {n for n, _ in read_members(out / "kept" / "00000.tar")} >= {f"{below[0]}.{'png' if below[0] == 'png' else 'jpg'}"}
    # kept/ and rejected/ still hold every input member once, byte for byte
    members = sorted(read_members(out / "kept" / "00000.tar") + read_members(out / "rejected" / "00000.tar"))
    assert members == sorted(read_members(root / "00000.tar"))


def test_another_detector_than_the_one_that_scored_the_kept_copy_applies_the_rule(three_copies):
    from collapseguard.filter.decisions import apply_group
    row = {"group": "g1", "decision": "keep", "rank": 1, "kept_score": 5.0, "kept_detector": "cnn@abc"}
    assert apply_group("kept", "kept", row, True, threshold=1.0, detector="cnn@abc") == ("kept", "kept")
    assert apply_group("kept", "kept", row, True, threshold=1.0, detector="cnn@other") == ("rejected", "duplicate")
    assert apply_group("kept", "kept", row, True, threshold=6.0, detector="cnn@abc") == ("rejected", "duplicate")


def test_the_full_size_original_is_kept_over_reduced_copies_the_comparator_cannot_tell_from_it(tmp_path):
    """Four photos, each as a full-size PNG and as a PNG reduced to 60% (Lanczos): the comparator
    alone kept the reduction about half the time (its P(worse) between the two is near 0.5).
    The larger copy it cannot tell apart is kept, with reason ``larger_copy`` where the
    comparator preferred the reduction, so ``--drop-duplicates`` keeps the full-size picture."""
    from collapseguard.dedup.run import TIE

    src = tmp_path / "photos"
    _photo_pairs(src, PHOTOS, 0.6, Image.LANCZOS, "_full.png", "_small.png")
    run_cli(["dedup", src, "--out", tmp_path / "d", "-w", "1", "-q"])
    g = _groups(tmp_path / "d")
    for name in ("chelsea", "coffee", "rocket", "astronaut"):
        full, small = g.loc[f"{name}_full.png"], g.loc[f"{name}_small.png"]
        assert full["group"] and full["group"] == small["group"]
        assert (full["rank"], full["decision"]) == (0, "keep"), g
        assert full["reason"] in ("least_degraded", "larger_copy")
        if full["reason"] == "larger_copy":  # the comparator's pick, within TIE of it
            assert np.isnan(small["p_worse"]) and full["p_worse"] <= TIE
        else:
            assert small["p_worse"] <= TIE


def test_a_larger_copy_is_kept_only_within_the_tie_and_its_tier():
    from collapseguard.dedup.run import TIE, larger_equal_copy

    p = np.array([np.nan, 0.6, 0.9, 0.6])
    px = np.array([100, 200, 400, 150])
    flat = np.zeros(4, np.int64)
    assert larger_equal_copy(0, p, flat, px) == 1  # 2 is larger, but the comparator tells it apart
    assert larger_equal_copy(0, p, np.array([0, 1, 0, 0]), px) == 3  # 1 is a monochrome copy
    assert larger_equal_copy(0, np.array([np.nan, TIE + 0.01, 0.9, 0.99]), flat, px) == 0
    assert larger_equal_copy(0, p, flat, np.array([100, 101, 400, 100])) == 0  # within 1%: the best
    # an enlargement (its fine detail under best's by more than OCTAVE_MARGIN) is not kept
    from collapseguard.dedup.run import OCTAVE_MARGIN

    oct_ = np.array([-0.5, -0.5 - OCTAVE_MARGIN - 0.01, -0.2, -0.6])
    assert larger_equal_copy(0, p, flat, px, oct_) == 3  # 1 lost its top octave: the next largest
    assert larger_equal_copy(0, p, flat, px, np.array([-0.5, np.nan, 0, 0])) == 1  # unknown: not refused
    assert larger_equal_copy(0, p, flat, px, np.array([np.nan, -3.0, 0, -3.0])) == 1  # best's unknown


def test_top_octave_tells_an_enlargement_from_a_reduction():
    """The detail a copy holds at its own size: a photo's 60% Lanczos reduction keeps it, a 150%
    bicubic enlargement loses it, a 2 px image has none to measure."""
    from collapseguard.detectors.pair_features import top_octave

    for name in ("chelsea", "coffee", "rocket", "astronaut"):
        im = Image.fromarray(getattr(sd, name)())
        o = top_octave(np.asarray(im))
        up = top_octave(np.asarray(im.resize((im.width * 3 // 2, im.height * 3 // 2), Image.BICUBIC)))
        down = top_octave(np.asarray(im.resize((im.width * 6 // 10, im.height * 6 // 10), Image.LANCZOS)))
        assert up < o - 0.3 and abs(down - o) < 0.3, (name, o, up, down)
    assert np.isnan(top_octave(np.zeros((2, 2, 3), np.uint8)))
    # a pixel-doubled picture and a copy cropped by an odd number of pixels read alike (both
    # grid phases of the 2x reduction), so a 1% crop never passes for the sharper copy
    moon = np.asarray(Image.fromarray(sd.camera()[::2, ::2]).resize((512, 512), Image.NEAREST))
    assert abs(top_octave(moon[5:-5, 5:-5]) - top_octave(moon)) < 0.1


def test_the_original_is_kept_over_its_enlargement(tmp_path):
    """Four photos, each as a PNG and as a 150% bicubic enlargement: both are the same picture to
    the comparator (it compares at the side both reach), but the enlargement holds no detail the
    original lacks, so the larger-copy rule does not keep it: the original is each group's copy."""
    src = tmp_path / "photos"
    _photo_pairs(src, PHOTOS, 1.5, Image.BICUBIC, ".png", "_x150.png")
    run_cli(["dedup", src, "--out", tmp_path / "d", "-w", "1", "-q"])
    g = _groups(tmp_path / "d")
    for name in ("chelsea", "coffee", "rocket", "astronaut"):
        orig, big = g.loc[f"{name}.png"], g.loc[f"{name}_x150.png"]
        assert orig["group"] and orig["group"] == big["group"]
        assert (orig["rank"], orig["decision"], orig["reason"]) == (0, "keep", "least_degraded"), g
        assert (big["decision"], big["reason"]) == ("keep", "duplicate")


def test_a_run_resumed_over_parts_without_top_octave_describes_them_again(tmp_path):
    """Parts written before descriptions carried ``octave`` (as an earlier build wrote them) hold
    nothing the larger-copy rule reads: a run resumed over them describes those images again
    and writes the bytes of an uninterrupted run, keeping each original over its enlargement."""
    import shutil

    from collapseguard.dedup.run import run_dedup

    src = tmp_path / "photos"
    _photo_pairs(src, PHOTOS[:3], 1.5, Image.BICUBIC, ".png", "_x150.png")
    fresh, resumed = tmp_path / "fresh", tmp_path / "resumed"
    run_dedup([str(src)], fresh, workers=1, quiet=True)
    shutil.copytree(fresh / ".parts", resumed / ".parts")
    stripped = 0
    for p in (resumed / ".parts").rglob("*.npz"):
        with np.load(p) as z:
            d = {k: z[k] for k in z.files if k != "octave"}
        with open(p, "wb") as fh:
            np.savez(fh, **d)
        stripped += 1
    assert stripped >= 2
    run_dedup([str(src)], resumed, workers=1, quiet=True)
    assert (resumed / "groups.parquet").read_bytes() == (fresh / "groups.parquet").read_bytes()
    g = _groups(resumed)
    assert all(g.loc[f"{n}.png", "rank"] == 0 for n in ("chelsea", "coffee", "rocket"))


def _shirt(colour) -> Image.Image:
    from PIL import ImageDraw
    im = Image.new("RGB", (400, 400), "white")
    ImageDraw.Draw(im).polygon([(120, 80), (170, 60), (230, 60), (280, 80), (340, 140), (300, 170),
                                (280, 150), (280, 340), (120, 340), (120, 150), (100, 170), (60, 140)],
                               fill=colour, outline=(20, 20, 20))
    return im


def test_colour_variants_of_one_layout_are_other_pictures_and_a_tinted_copy_is_not(tmp_path):
    """One product shot in four colours, each as PNG and JPEG q60: the luma fingerprints group all
    eight, but each colour is its own picture, so each colour's two copies form a group of their
    own and no shirt is a degraded or duplicate copy of another colour's; a photo's copy with a
    green cast of 15 levels stays in its group, and a shirt alone in its colour is a single with
    reason colour_variant. A black shirt, first in the shard, has no colour: it starts no set (the
    order of the rows does not decide whether the group is cut), and its tones are no greyscale
    copy's of a coloured shirt, so it is a product of its own, not a lost-colour copy."""
    samples = [("black_png", "png", _enc(_shirt((20, 20, 20)), "PNG"))]  # first: no colour, so no seed
    for name, colour in (("red", (200, 30, 30)), ("blue", (30, 60, 200)), ("green", (30, 160, 60)),
                         ("purple", (120, 40, 160))):
        im = _shirt(colour)
        samples.append((f"{name}_png", "png", _enc(im, "PNG")))
        samples.append((f"{name}_jpg", "jpg", _enc(im, "JPEG", quality=60)))
    samples.append(("yellow_png", "png", _enc(_shirt((240, 200, 40)), "PNG")))
    photo = Image.fromarray(sd.coffee())
    tinted = np.asarray(photo, np.float32) + np.array([-7.5, 15, -7.5], np.float32)
    samples += [("coffee", "png", _enc(photo, "PNG")),
                ("coffee_tint", "png", _enc(Image.fromarray(np.clip(tinted, 0, 255).astype(np.uint8)), "PNG"))]
    _shard(tmp_path / "shirts.tar", samples)
    run_cli(["dedup", tmp_path / "shirts.tar", "--out", tmp_path / "dd", "-w", "1", "-q"])
    g = _groups(tmp_path / "dd")
    names = ("red", "blue", "green", "purple")
    for name in names:
        png, jpg = g.loc[f"{name}_png"], g.loc[f"{name}_jpg"]
        assert png["group"] and png["group"] == jpg["group"], g[["group", "rank", "reason"]]
        assert set(g.loc[g["group"] == png["group"]].index) == {f"{name}_png", f"{name}_jpg"}
    assert (g.loc["yellow_png", "decision"], g.loc["yellow_png", "reason"]) == ("single", "colour_variant")
    assert g.loc["coffee", "group"] and g.loc["coffee", "group"] == g.loc["coffee_tint", "group"]
    summary = __import__("json").loads((tmp_path / "dd" / "summary.json").read_text())
    # the black shirt's tones are not a greyscale copy's of any colour: a product of its own
    assert (g.loc["black_png", "decision"], g.loc["black_png", "reason"]) == ("single", "colour_variant")
    assert summary["groups"] == 5 and summary["grouped"] == 10


def test_colour_sets_do_not_depend_on_row_order_and_hold_no_two_variants():
    """The same copies in any row order give the same sets (their order is read from the layouts),
    and no set holds two copies the rule tells apart: red, orange and yellow shirts (red and
    yellow told apart, orange near both) never end in one set, however the rows are named."""
    import itertools

    from collapseguard.dedup.colour import colour_variants, split_colour_variants
    from collapseguard.detectors.pair_features import colour_layout

    colours = [(200, 30, 30), (240, 120, 20), (230, 200, 30), (30, 60, 200), (20, 20, 20)]
    layout = np.array([colour_layout(np.asarray(_shirt(c))) for c in colours])
    assert colour_variants(layout[0], layout[2]) and not colour_variants(layout[0], layout[1])
    seen = set()
    for perm in itertools.permutations(range(len(colours))):
        sets = split_colour_variants(np.array(perm), layout)
        seen.add(frozenset(frozenset(s.tolist()) for s in sets))
        for s in sets:
            assert not any(colour_variants(layout[a], layout[b]) for a in s for b in s if a < b)
    assert len(seen) == 1, seen


def test_a_greyscale_copy_keeps_its_tones_and_a_grey_product_does_not():
    """The luma of the layout tells a greyscale copy of a red shirt (the lost-colour rule's: its
    tones are the red shirt's, darker or not) from a grey shirt (another product)."""
    from collapseguard.dedup.colour import has_colour, tones_apart
    from collapseguard.detectors.pair_features import colour_layout

    red = _shirt((200, 30, 30))
    grey_copy = red.convert("L").convert("RGB")
    darker = Image.fromarray(np.clip(np.asarray(grey_copy, np.int16) - 20, 0, 255).astype(np.uint8))
    lay = {k: colour_layout(np.asarray(v)) for k, v in
           (("red", red), ("copy", grey_copy), ("darker", darker), ("grey", _shirt((128, 128, 128))))}
    assert has_colour(lay["red"]) and not has_colour(lay["copy"]) and not has_colour(lay["grey"])
    assert not tones_apart(lay["red"], lay["copy"]) and not tones_apart(lay["red"], lay["darker"])
    assert tones_apart(lay["red"], lay["grey"])
