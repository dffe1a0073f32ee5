"""recipes/judge_cnn.py: the rule's terms for the shipped weights and a candidate, from real scores
of a small evaluation set and web-history set, checked against the scores it caches."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from PIL import Image


def _noisy(img: np.ndarray, sd: float, rng) -> np.ndarray:
    return np.clip(img + rng.normal(0, sd, img.shape), 0, 255).astype(np.uint8)


def test_judge_prints_the_rule_terms_of_the_scores_it_caches(tmp_path, recipe_script, photos, capsys):
    from collapseguard.detectors.cnn import CNNDetector

    rec = recipe_script("judge_cnn.py")
    rng = np.random.default_rng(0)
    ev = tmp_path / "eval"
    rows = []
    chains = [("noise_tint", "photo"), ("noise_tint", "flat_art"), ("noise_tint", "photo"),
              ("realesrgan", "photo"), ("realesrgan", "flat_art"), ("realesrgan", "flat_art"),
              ("maxim_retouch", "photo")]  # a held-out network whose later steps are cleaner
    for c, (fam, kind) in enumerate(chains):  # three step-0 images of each kind: a median, not a mean
        src = photos[c % len(photos)][:96, :96].astype(float) if kind == "photo" else np.full((96, 96, 3), 60.0 + 25 * c)
        for step in (0, 5, 10):
            path = f"{fam}/c{c}/step_{step:03d}.png"
            (ev / path).parent.mkdir(parents=True, exist_ok=True)
            sd = 4 * (10 - step) if fam == "maxim_retouch" else 4 * step
            Image.fromarray(_noisy(src, sd, rng)).save(ev / path)
            rows.append({"chain_id": f"c{c}", "family": fam, "kind": kind, "step": step,
                         "storage": "png", "path": path})
    pd.DataFrame(rows).to_csv(ev / "manifest.csv", index=False)
    wh = tmp_path / "wh"
    wh.mkdir()
    whrows = []
    for i, kind in enumerate(["photo", "photo", "anime"]):
        pic = photos[i % len(photos)][10 * i:10 * i + 80, :80]
        Image.fromarray(pic).save(wh / f"p{i}.png")
        Image.fromarray(pic).save(wh / f"p{i}.jpg", quality=90)
        whrows.append({"kind": kind, "png": f"p{i}.png", "jpeg90": f"p{i}.jpg"})
    pd.DataFrame(whrows).to_csv(wh / "manifest.csv", index=False)

    assert rec.main(["--eval", str(ev / "manifest.csv"), "--web-history", str(wh / "manifest.csv"),
                     "--cache", str(tmp_path / "cache"), "--storage", "png"]) == 0
    out = capsys.readouterr().out
    terms = json.loads(out[out.index("rule terms:") + len("rule terms:"):])
    det = CNNDetector(device="cpu")
    cached = pd.read_csv(tmp_path / "cache" / f"cnn-{det.version}.csv")
    s = dict(zip(cached["path"], cached["score"]))
    assert len(s) == len(rows) + 2 * len(whrows)  # every image scored once, then read from the cache
    m = pd.DataFrame(rows).assign(score=[s[str(ev / p)] for p in pd.DataFrame(rows)["path"]])
    step0 = m[m["step"] == 0]
    med = step0.groupby("kind")["score"].median()
    assert np.isclose(terms["kind_spread_sd"]["png"], (med.max() - med.min()) / step0["score"].std())
    held = m[m["family"] == "realesrgan"]
    neg, pos = held.loc[held["step"] == 0, "score"], held.loc[held["step"] == 10, "score"]
    auroc = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])
    mx = m[m["family"] == "maxim_retouch"]
    mx_auroc = float(mx.loc[mx["step"] == 10, "score"].iloc[0] > mx.loc[mx["step"] == 0, "score"].iloc[0])
    assert mx_auroc < auroc  # so the held-out term is the MAXIM family's
    assert np.isclose(terms["worst_held_out_0v10"]["png"], min(auroc, mx_auroc))
    nt = m[m["family"] == "noise_tint"]  # the network families are no default family
    nt_auroc = np.mean([(p > n) + 0.5 * (p == n) for p in nt.loc[nt["step"] == 5, "score"]
                        for n in nt.loc[nt["step"] == 0, "score"]])
    assert np.isclose(terms["worst_default_0v5"]["png"], nt_auroc)
    # the rules written before the MAXIM families read the two older held-out networks only
    assert rec.main(["--eval", str(ev / "manifest.csv"), "--web-history", str(wh / "manifest.csv"),
                     "--cache", str(tmp_path / "cache"), "--storage", "png",
                     "--held-out", "realesrgan,waifu2x_upconv7"]) == 0
    out = capsys.readouterr().out
    terms = json.loads(out[out.index("rule terms:") + len("rule terms:"):])
    assert np.isclose(terms["worst_held_out_0v10"]["png"], auroc)
