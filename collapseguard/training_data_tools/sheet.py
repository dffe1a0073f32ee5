"""Contact sheets: rows = chains, columns = steps, native-resolution crops.

Crops are never resized (resizing would hide the noise and dots the detector exists to see): each
chain shows the same ``crop`` x ``crop`` window at every step, placed where step 0 has the most
detail (or at the centre). Rows are picked to cover every family.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw

from collapseguard.images import load_image
from collapseguard.training_data_tools.loaders import load_chains

_LABEL_W, _HEAD_H, _GAP = 190, 18, 4


def _crop_box(img: np.ndarray, crop: int, where: str) -> tuple[int, int]:
    h, w = img.shape[:2]
    ch, cw = min(crop, h), min(crop, w)
    if where == "centre":
        return (h - ch) // 2, (w - cw) // 2
    # most detail: the window with the largest mean gradient magnitude on a coarse grid
    g = img.astype(np.float32).mean(2)
    e = np.abs(np.diff(g, axis=0))[:, :-1] + np.abs(np.diff(g, axis=1))[:-1, :]
    best, pos = -1.0, (0, 0)
    step = max(8, crop // 4)
    for y in range(0, max(1, h - ch + 1), step):
        for x in range(0, max(1, w - cw + 1), step):
            v = float(e[y:y + ch - 1, x:x + cw - 1].mean())
            if v > best:
                best, pos = v, (y, x)
    return pos


def pick_chains(df: pd.DataFrame, max_chains: int) -> list[str]:
    """Up to ``max_chains`` chain ids, round-robin over families (in sorted order)."""
    by_fam = {f: sorted(g["chain_id"].unique()) for f, g in df.groupby("family")}
    out = []
    while len(out) < max_chains and any(by_fam.values()):
        for f in sorted(by_fam):
            if by_fam[f] and len(out) < max_chains:
                out.append(by_fam[f].pop(0))
    return out


def _load(path, unreadable: list[str]) -> np.ndarray | None:
    """The image, or None (its path and why appended to ``unreadable``) when it cannot be read."""
    try:
        return load_image(path)
    except (OSError, ValueError) as exc:  # DecodeError is a ValueError
        unreadable.append(f"{path}: {exc}" if str(path) not in str(exc) else str(exc))
        return None


def contact_sheet(chains: str | Path | pd.DataFrame, out: str | Path, crop: int = 160,
                  steps: list[int] | None = None, max_chains: int = 16,
                  families: list[str] | None = None, where: str = "detail",
                  unreadable: list[str] | None = None) -> Path:
    """Write a PNG contact sheet of ``chains`` (a manifest or anything ``load_chains`` reads).
    An image that cannot be read is a tile that says so (its path and why appended to
    ``unreadable``), not the end of the sheet."""
    unreadable = [] if unreadable is None else unreadable
    df = chains if isinstance(chains, pd.DataFrame) else load_chains(chains)
    if families:
        unknown = sorted(set(families) - set(df["family"]))
        if unknown:
            raise ValueError(f"no chains of famil(y/ies) {unknown}; have {sorted(df['family'].unique())}")
        df = df[df["family"].isin(families)]
    if crop < 16:
        raise ValueError("crop must be at least 16 pixels")
    kept = sorted(int(k) for k in df["step"].unique())
    absent = sorted(set(steps or ()) - set(kept))
    if absent:  # a column no chain can fill would be blank
        raise ValueError(f"no chain has step(s) {absent}; the steps kept are {kept}")
    cols = kept if not steps else sorted(set(steps))
    ids = pick_chains(df, max_chains)
    chains_rows = [df[df["chain_id"] == cid].set_index("step") for cid in ids]
    bases = [_load(rows.loc[rows.index.min(), "path"], unreadable) for rows in chains_rows]
    # tiles as large as the crops can be: a --crop beyond every image would only add white
    tile_h = min(crop, max((b.shape[0] for b in bases if b is not None), default=crop)) + _GAP
    tile_w = min(crop, max((b.shape[1] for b in bases if b is not None), default=crop)) + _GAP
    sheet = Image.new("RGB", (_LABEL_W + tile_w * len(cols), _HEAD_H + tile_h * len(ids)),
                      (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for j, s in enumerate(cols):
        draw.text((_LABEL_W + j * tile_w + 4, 3), f"step {s}", fill=(0, 0, 0))
    for i, (cid, rows, base) in enumerate(zip(ids, chains_rows, bases)):
        y0 = _HEAD_H + i * tile_h
        fam = rows["family"].iloc[0]
        draw.text((4, y0 + 4), str(fam)[:28], fill=(0, 0, 120))
        name = str(cid)
        for k in range(0, min(len(name), 84), 28):
            draw.text((4, y0 + 20 + k // 28 * 14), name[k:k + 28], fill=(60, 60, 60))
        by, bx = _crop_box(base, crop, where) if base is not None else (0, 0)
        for j, s in enumerate(cols):
            if s not in rows.index:
                continue
            img = (base if base is not None and s == rows.index.min()
                   else _load(rows.loc[s, "path"], unreadable))
            if img is None:
                draw.text((_LABEL_W + j * tile_w + 4, y0 + 4), "unreadable", fill=(200, 0, 0))
                continue
            patch = img[by:by + crop, bx:bx + crop]
            sheet.paste(Image.fromarray(np.ascontiguousarray(patch)), (_LABEL_W + j * tile_w, y0))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # written beside and renamed over --out, as every other output: a link there is replaced,
    # never written through (it could point at any file)
    from collapseguard.io.atomic import replaced_when_done
    with replaced_when_done(out, suffix=out.suffix or ".png") as tmp:
        sheet.save(tmp, format=None if out.suffix else "PNG")
    return out
