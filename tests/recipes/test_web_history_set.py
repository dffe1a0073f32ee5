"""recipes/web_history_set.py: a web-history copy of every clean source, listed with its kind and
history, stored as PNG and JPEG q90; and web-history copies of a clean folder for calibration."""

from __future__ import annotations

import numpy as np
import pandas as pd
from PIL import Image


def test_build_and_folder_give_each_picture_one_reproducible_history(tmp_path, recipe_script, photos):
    rec = recipe_script("web_history_set.py")
    ev = tmp_path / "eval"
    (ev / "sources").mkdir(parents=True)
    rows = []
    for i, img in enumerate(photos[:3]):
        Image.fromarray(img).save(ev / "sources" / f"pic{i}.png")
        rows.append({"name": f"pic{i}", "kind": "photo" if i else "portrait", "package": "p", "file": "f"})
    pd.DataFrame(rows).to_csv(ev / "sources.csv", index=False)
    df = rec.build(ev, tmp_path / "wh")
    assert list(df["name"]) == ["pic0", "pic1", "pic2"] and set(df["kind"]) == {"photo", "portrait"}
    assert all("jpeg" in h for h in df["history"])
    first = {n: np.asarray(Image.open(p)) for n, p in zip(df["name"], df["png"])}
    assert all(Image.open(p).format == "JPEG" for p in df["jpeg90"])
    again = rec.build(ev, tmp_path / "wh2")  # the same seed: the same histories and pixels
    assert list(again["history"]) == list(df["history"])
    assert all(np.array_equal(first[n], np.asarray(Image.open(p))) for n, p in zip(again["name"], again["png"]))
    assert pd.read_csv(tmp_path / "wh" / "manifest.csv")["history"].tolist() == list(df["history"])
    (ev / "sources" / "sub").mkdir()
    (ev / "sources" / "sub" / "bad.png").write_bytes(b"not an image")
    n = rec.folder(ev / "sources", tmp_path / "web")
    assert n == 3 and sorted(p.name for p in (tmp_path / "web").rglob("*.png")) == ["pic0.png", "pic1.png", "pic2.png"]
