"""Storage as training data (training.storage, --delivery-kind web): every kind is drawn, each
reads back as that codec would store it, chains keep one storage per chain, clean images get the
same storages, and the CLI records the setting."""

from __future__ import annotations

import io
import json
from collections import Counter

import numpy as np
import pytest
from cg_chains import make_clean_dir, make_tiny_chains, smooth_art
from click.testing import CliRunner
from PIL import Image

from collapseguard.cli import main
from collapseguard.training.bank import chain_bank
from collapseguard.training.storage import KINDS, Storage, apply_storage, draw_storage


def _noisy(h=96, w=128, seed=0):
    rng = np.random.default_rng(seed)
    base = smooth_art(rng, h, w).astype(float)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def test_draws_cover_every_kind_with_jpeg_420_the_common_case():
    rng = np.random.default_rng(0)
    draws = [draw_storage(rng) for _ in range(3000)]
    kinds = Counter(d.kind for d in draws)
    assert set(kinds) == {k for k, _, _ in KINDS}
    assert kinds.most_common(1)[0][0] == "jpeg420" and kinds["jpeg420"] > 0.4 * len(draws)
    q420 = [d.quality for d in draws if d.kind == "jpeg420"]
    assert min(q420) == 60 and max(q420) == 95
    assert all(d.quality == 0 for d in draws if d.kind == "png")
    resized = [d.scale for d in draws if d.scale != 1.0]
    assert 0.15 < len(resized) / len(draws) < 0.35 and 0.5 <= min(resized) and max(resized) <= 0.9
    # the same seed draws the same storages
    again = np.random.default_rng(0)
    assert [draw_storage(again) for _ in range(50)] == draws[:50]


def test_each_storage_reads_back_as_that_codec_stores_it():
    img = _noisy()
    assert np.array_equal(apply_storage(img, Storage("png")), img)

    def pil_round_trip(fmt, **kw):
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format=fmt, **kw)
        return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))

    np.testing.assert_array_equal(apply_storage(img, Storage("jpeg420", 80)),
                                  pil_round_trip("JPEG", quality=80, subsampling=2))
    np.testing.assert_array_equal(apply_storage(img, Storage("jpeg444", 80)),
                                  pil_round_trip("JPEG", quality=80, subsampling=0))
    np.testing.assert_array_equal(apply_storage(img, Storage("webp", 70)),
                                  pil_round_trip("WEBP", quality=70))
    # 4:2:0 loses chroma detail that 4:4:4 at the same quality keeps
    def chroma_err(out):
        d = out.astype(float) - img.astype(float)
        return np.abs(d[..., 0] - d[..., 1]).mean() + np.abs(d[..., 2] - d[..., 1]).mean()
    assert chroma_err(apply_storage(img, Storage("jpeg420", 90))) > 1.3 * chroma_err(
        apply_storage(img, Storage("jpeg444", 90)))
    small = apply_storage(img, Storage("png", 0, 0.75))
    assert small.shape == (72, 96, 3)
    with pytest.raises(ValueError, match="storage kind"):
        apply_storage(img, Storage("gif", 10))


def test_web_delivery_stores_each_chain_one_way_and_keeps_its_crops_aligned(tmp_path):
    from collapseguard.training_data_tools.manifest import read_manifest

    df = read_manifest(make_tiny_chains(tmp_path, n_sources=12, steps=(0, 3, 5)))
    bank = chain_bank(df, size=32, per_image=3, seed=4, delivery_jpeg=1.0, delivery_kind="web")
    per_chain = bank.meta.groupby("chain_id")["storage"].nunique()
    assert (per_chain == 1).all()
    assert bank.meta["aligned"].all()
    kinds = {s.split("q")[0].split("@")[0] for s in bank.meta["storage"]}
    assert len(kinds) >= 3  # 24 chains: several storages drawn
    jq = bank.meta["jpeg_quality"].to_numpy()
    is_jpeg = bank.meta["storage"].str.startswith("jpeg").to_numpy()
    assert (jq[is_jpeg] > 0).all() and (jq[~is_jpeg] == 0).all()
    plain = chain_bank(df, size=32, per_image=3, seed=4)
    assert "storage" not in plain.meta  # the default bank is as it was
    png = (bank.meta["storage"] == "png").to_numpy()
    np.testing.assert_array_equal(bank.crops[png], plain.crops[png])
    with pytest.raises(ValueError, match="delivery_kind"):
        chain_bank(df, size=32, per_image=3, seed=4, delivery_jpeg=1.0, delivery_kind="gif")


def test_clean_variants_with_storage_are_stored_like_chain_images(tmp_path):
    from collapseguard.training.negatives import clean_variants

    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(smooth_art(rng, 300, 400)).save(tmp_path / f"p{i}.png")
    files = sorted(tmp_path.glob("*.png"))
    plain = dict(clean_variants(files, 3, seed=1, long_side=(200, 250), window_side=128))
    stored = dict(clean_variants(files, 3, seed=1, long_side=(200, 250), window_side=128, storage=True))
    assert list(plain) == list(stored)
    # the as-is copies are no longer the PNG pixels: most pass through a lossy storage
    changed = [n for n in plain if n.endswith("#0") and not (
        plain[n].shape == stored[n].shape and np.array_equal(plain[n], stored[n]))]
    assert len(changed) >= 2


def test_train_cli_web_delivery_is_recorded(tmp_path):
    chains = make_tiny_chains(tmp_path / "chains", n_sources=6)
    clean = make_clean_dir(tmp_path / "clean")
    out = tmp_path / "w.safetensors"
    res = CliRunner().invoke(main, ["train", "--chains", str(chains), "--clean", str(clean), "--out", str(out),
                                    "--steps", "3", "--threads", "1", "--width", "4", "--crop-size", "32",
                                    "--n-crops", "4", "--no-eval", "--delivery-jpeg", "1",
                                    "--delivery-kind", "web"])
    assert res.exit_code == 0, res.output
    cfg = json.loads(out.with_suffix(".json").read_text())["config"]
    assert cfg["delivery_kind"] == "web" and cfg["delivery_jpeg"] == 1.0
    bad = CliRunner().invoke(main, ["train", "--chains", str(chains), "--out", str(out), "--steps", "1",
                                    "--delivery-kind", "bmp"])
    assert bad.exit_code != 0 and "delivery-kind" in bad.output
