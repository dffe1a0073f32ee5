"""Grouping 1,000,000 fingerprints: time and peak memory of ``dedup.groups.group_ids``.

    OMP_NUM_THREADS=2 taskset -c 0,1 python benchmarks/dedup_scale.py [--n 1000000] [--groups 50000] [--no-windows]

Synthetic fingerprints with planted near-duplicate groups: ``--groups`` groups of 2-8 copies each,
every copy its group's original 64-bit hash with 0-8 bits flipped and the original's thumbnail
plus noise (correlation with the original about 0.9), a third of them made so from one of the
original's central windows instead (a crop), the rest unrelated (uniform random hashes and
thumbnails). Every fingerprint has its windows' too (``fingerprint.WINDOWS``), which the search
looks up against the others' whole fingerprints (``--no-windows``: the whole fingerprints
alone). Prints the seconds of the candidate search, verification and grouping, the peak
resident memory of the process (generation included), the share of planted copies found in
their group, and how many unrelated fingerprints joined any group.

With ``--throughput IMAGES``: ``dedup`` end to end (``run_dedup``) against the floor, plain PIL
decoding of the same shards (``throughput.floor_task``), both in one process or both in
``--workers`` processes, alternating, in ``--rounds`` rounds; IMAGES 1024 x 768 JPEG q92 images
in shards: distinct framings of the bundled photos, no two of one picture (``distinct_shards``,
at most 1,152), or with ``--base crops`` the filter benchmark's overlapping crops
(``throughput.make_shards``, any number), many of which are crops of one another. Prints
images/s of each (median), the ratio, the share of images grouped, and the wall time of each of
``dedup``'s passes (``run_dedup``'s ``seconds``) per image it handles:

    python benchmarks/dedup_scale.py --throughput 64 [--rounds 3] [--copy-share 0.1] [--workers 2] [--threads 1]

With one process the comparator is loaded once, outside the timing, and runs on ``--threads``
torch threads (``run_dedup``'s ``threads``; 0: torch's own count); worker processes load their
own, inside it (as the floor's pool starts inside its timing), on one thread each.

``--cnn-crops K`` (one process) scores the grouped images with the comparator's cnn on K crops
each instead of the weights' own count: a lever that trades accuracy for speed, measured here
and with ``--chains`` (not an option of ``dedup``).

``--cnn-batch N`` (one process) scores N images per cnn call in the comparator pass instead of
``dedup.describe.CNN_BATCH``.

``--copy-share F`` adds resized JPEG q75 copies of some of the images so that about F of all
images are in a group of two (the images the comparator describes) on the distinct base (on
``--base crops`` more group); it also prints how many images were grouped and described.

With ``--chains MANIFEST``: ``dedup`` end to end on replication chains mixed with unrelated
pictures and harmless copies, and its grouping and ranking figures:

    python benchmarks/dedup_scale.py --chains MANIFEST --work WORK [--max-step 10]
        [--max-sources N] [--held-out] [--unrelated art:60:256-640,pixel:20,screen:20] [--copies 2] [--workers 1]

With ``--copy-kinds KINDS`` (default kinds: ``COPY_KINDS``): which harmless copies of a picture
``dedup`` joins to it, and which copy it keeps. Every bundled photo
(``training_data_tools.sources.bundled_photos``, short side 256 or more) is written as a lossless
PNG original beside one copy of one kind, each kind its own ``dedup`` run (so copies of two kinds
never join through each other); printed per kind: the share of copies grouped with their
original and, of those groups, the share that keep the original (``rank`` 0) and that mark it
``degraded_copy``, how many copies are marked ``degraded_copy``, the range of the pairs' ``p_worse``, and the range of the copies'
``top_octave`` minus their original's with the share more than 0.5 under it (an enlargement,
which the larger-copy rule does not keep). ``--framing-margin inf`` compares every copy with
the kept one, a crop too (``groups.FRAMING_MARGIN``). ``--pictures samples`` runs it on the library sample
images instead (skimage's and scikit-learn's, short side 200 px or more). Kinds: ``cropP`` (P% cut from every side, PNG), ``resizeS`` / ``upscaleS``
(S% of each side, Lanczos / bicubic, PNG), ``jpegQ`` (JPEG quality Q, 4:2:0), ``webQ`` (reduced
to 70%, JPEG q80, enlarged back, JPEG quality Q); damaged copies, which a group should not keep
over its original: ``blurR`` (Gaussian blur of radius R/10 px, PNG), ``noiseS`` (Gaussian noise
of standard deviation S, PNG), ``resaveN`` (N JPEG q50 saves), ``classicN`` (N rounds of a 1 px
blur, noise of standard deviation 3 and a JPEG q70 save):

    python benchmarks/dedup_scale.py --copy-kinds crop1,crop2,crop3,crop5,crop10,resize60,upscale150,jpeg92,jpeg75,web85 --work WORK

MANIFEST is a chain manifest (``chains make``, or ``chains store``'s with a ``storage`` column, as
``recipes/eval_set.sh`` writes it). WORK receives the images (each chain image at step <=
``--max-step`` as it is stored, ``--copies`` harmless copies of each source picture:
``dedup.copies.random_copy``, and ``--unrelated`` clean pictures), shuffled under random names, and
the ``dedup`` output. One source picture is one picture: its chains of every family and storage
and its harmless copies belong together. Prints:

- per family and step, the share of chain images in the group of their source's step-0 image;
- the share of images (chain images, copies, unrelated pictures) whose group holds a majority
  of another picture (a wrong group);
- per family, how often the comparator ranks step 0 above a step >= 3 image (and how often the
  cnn's score alone does) and step 1 above step 5, inside a group, and the share of step >= 5
  images marked ``degraded_copy``;
- per family, the share of step >= 5 images the filter rejects with the cnn at its shipped
  threshold alone and with ``--groups`` (a degraded copy is rejected too), and the same for
  the clean images (step 0, harmless copies, unrelated pictures);
- the share of step-0 images and of harmless copies marked ``degraded_copy``;
- with ``--hashes``, for the pHash ``dedup`` uses, a difference hash and an average hash: the
  share of chain images within 8 bits of their picture's step 0, and the share of pairs of
  different pictures within 8 bits of each other.

With ``--shards N`` the same images (each one's bytes as stored, under its extension, keyed by its
random name) go shuffled into N WebDataset shards (WORK/shards/), and the command line runs on
them in subprocesses: ``collapseguard dedup SHARDS --out WORK/dedup``, then ``collapseguard filter
SHARDS --groups WORK/dedup/groups.parquet --out WORK/filter_groups-DIGEST`` (DIGEST: the table's
SHA-256, so that a changed table gets a new output) and the no-reference ``collapseguard filter
SHARDS --out WORK/filter_plain`` (the cnn at its shipped threshold), each run resuming in WORK
(the seconds printed are those of this run: a resumed step takes seconds).
The grouping figures come from ``dedup``'s table as above; the filter figures from the two
filters' scores tables: per family the share of step >= 5 images each rejects, and the same for
the clean images. Then a conservation check of each filter output: every input member (name and
SHA-256 of its bytes) is in exactly one of kept/ and rejected/, on the side its scores row
decides, and nothing else is there; the counts are printed, and a lost, changed, doubled or
misplaced member ends the script with an error naming it:

    python benchmarks/dedup_scale.py --chains MANIFEST --work WORK --shards 16 [--max-sources N]
"""

from __future__ import annotations

import argparse
import io
import json
import re
import resource
import shutil
import time
from collections import Counter, defaultdict
from pathlib import Path

# light imports only at the top: spawned worker processes (plain decoding's and dedup's alike)
# import this script, and a heavy import there would slow both by the same fixed time
import numpy as np
from PIL import Image, ImageFilter


def _unit_int8(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` as zero-mean, unit-norm int8 thumbnails (x 127)."""
    x = x - x.mean(axis=-1, keepdims=True)
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    return np.round(x * 127).astype(np.int8)


def make(n: int, n_groups: int, seed: int = 0, crop_share: float = 1 / 3):
    """``(hashes, thumbs, window_hashes, window_thumbs, truth, planted)``: ``n`` synthetic
    fingerprints, each with ``len(WINDOWS)`` window fingerprints, ``n_groups`` planted groups of
    2-8 copies. A copy is its original's hash with 0-8 bits flipped and thumbnail plus noise; a
    ``crop_share`` of the copies are crops: the same made from one of the original's windows
    (the others' windows are the original's, with the same noise)."""
    from collapseguard.detectors.fingerprint import WINDOWS

    rng = np.random.default_rng(seed)
    k_win = len(WINDOWS)
    sizes = rng.integers(2, 9, n_groups)
    planted = int(sizes.sum())
    if planted > n:
        raise SystemExit(f"{planted} planted copies do not fit in {n}")

    def random_hashes(shape):
        h = rng.integers(0, 2**63, shape, dtype=np.int64).astype(np.uint64) << np.uint64(1)
        return h | rng.integers(0, 2, shape).astype(np.uint64)

    hashes, whashes = random_hashes(n), random_hashes((n, k_win))
    thumbs = np.empty((n, 256), np.int8)
    wthumbs = np.empty((n, k_win, 256), np.int8)
    step = 1 << 16
    for s in range(0, n, step):  # unrelated rows as drawn; in chunks (float32 of all would be GBs)
        thumbs[s: s + step] = _unit_int8(rng.standard_normal((min(step, n - s), 256), dtype=np.float32))
        wthumbs[s: s + step] = _unit_int8(rng.standard_normal((min(step, n - s), k_win, 256), dtype=np.float32))
    truth = np.full(n, -1, np.int64)
    noise = 0.45 / 16  # per element of a unit-norm thumbnail: a correlation of about 0.9
    row = 0
    for g, k in enumerate(sizes):
        rows = np.arange(row, row + k)
        truth[rows] = g
        flips = rng.integers(0, 9, k)
        crop = rng.random(k) < crop_share
        win = rng.integers(0, k_win, k)
        for i, (r, f) in enumerate(zip(rows, flips)):
            if i == 0:  # the group's original
                continue
            bits = rng.choice(64, f, replace=False).astype(np.uint64)
            mask = np.bitwise_or.reduce(np.uint64(1) << bits) if f else np.uint64(0)
            src_hash, src_thumb = (whashes[row, win[i]], wthumbs[row, win[i]]) if crop[i] else (hashes[row], thumbs[row])
            hashes[r] = src_hash ^ mask
            thumbs[r] = _unit_int8(src_thumb.astype(np.float32) / 127 + noise * rng.standard_normal(256, dtype=np.float32))
            if not crop[i]:  # the same framing: its windows are the original's, with as much noise
                whashes[r] = whashes[row] ^ mask
                wthumbs[r] = _unit_int8(wthumbs[row].astype(np.float32) / 127
                                        + noise * rng.standard_normal((k_win, 256), dtype=np.float32))
        row += k
    perm = rng.permutation(n)  # planted copies spread over the whole table
    return hashes[perm], thumbs[perm], whashes[perm], wthumbs[perm], truth[perm], planted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--groups", type=int, default=50_000)
    ap.add_argument("--chains", metavar="MANIFEST", default=None)
    ap.add_argument("--throughput", type=int, metavar="IMAGES", default=None)
    ap.add_argument("--work")
    ap.add_argument("--max-step", type=int, default=10)
    ap.add_argument("--max-sources", type=int, default=None)
    ap.add_argument("--held-out", action="store_true",
                    help="only the sources recipes/compare_weights.py holds out from fitting")
    ap.add_argument("--unrelated", default="art:60:256-640,pixel:20,screen:20")
    ap.add_argument("--unrelated-seed", type=int, default=11)
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cnn-crops", type=int, default=None, metavar="K",
                    help="with --throughput or --chains (one process, no --shards): the comparator's cnn "
                         "on K crops an image instead of its weights' own (a speed lever: its accuracy cost)")
    ap.add_argument("--compare-weights", default=None, metavar="FILE",
                    help="with --throughput or --chains (one process, no --shards): comparator "
                         "weights other than the packaged ones")
    ap.add_argument("--compare-cnn", default=None, metavar="FILE",
                    help="likewise: the cnn weights the comparator reads (default: its packaged "
                         "compare_cnn), e.g. the shipped cnn's to measure a refit on them")
    ap.add_argument("--runtime", choices=("auto", "torch", "onnx"), default="auto",
                    help="what runs the comparator's cnn, as `dedup --runtime` (its default: auto)")
    ap.add_argument("--cnn-batch", type=int, default=None, metavar="N",
                    help="with --throughput: images per cnn call in the comparator pass "
                         "(default: dedup.describe.CNN_BATCH)")
    ap.add_argument("--threads", type=int, default=1,
                    help="with --throughput and one process: torch threads of the comparator (0: torch's own)")
    ap.add_argument("--tie", type=float, default=None, metavar="P",
                    help="dedup.run.TIE for this run's decisions (made in this process): "
                         "-1 keeps the comparator's least degraded copy alone, never a larger one")
    ap.add_argument("--no-windows", action="store_true",
                    help="group the 1,000,000 fingerprints by their whole fingerprints alone (the "
                         "windows' cost; the planted crops are then mostly not found)")
    ap.add_argument("--framing-margin", type=float, default=None, metavar="M",
                    help="groups.FRAMING_MARGIN for this run (inf: every copy framed as the kept one, "
                         "so a crop is compared with its original)")
    ap.add_argument("--octave-margin", type=float, default=None, metavar="M",
                    help="dedup.run.OCTAVE_MARGIN for this run's decisions (made in this process): "
                         "inf keeps a larger copy whatever its fine detail")
    ap.add_argument("--pictures", choices=("bundled", "samples"), default="bundled",
                    help="--copy-kinds' pictures: the bundled photos, or the library sample images "
                         "(skimage.data's and scikit-learn's, short side 200 or more)")
    ap.add_argument("--copy-kinds", default=None, metavar="KINDS",
                    help=f"which copies dedup joins to their original and keeps (e.g. {COPY_KINDS})")
    ap.add_argument("--copy-share", type=float, default=0.0,
                    help="with --throughput: add copies so that about this share of images is in a group")
    ap.add_argument("--base", choices=("distinct", "crops"), default="distinct",
                    help="with --throughput: the images before the copies: distinct framings, no two of "
                         "one picture (so --copy-share is the share dedup groups; at most 1,152 images), "
                         "or the filter benchmark's overlapping crops, many of them crops of one another")
    ap.add_argument("--hashes", action="store_true",
                    help="with --chains: also compare the pHash with a difference and an average hash")
    ap.add_argument("--shards", type=int, default=0, metavar="N",
                    help="with --chains: write the images into N shards and run dedup and filter "
                         "(with and without --groups) on them through the command line")
    args = ap.parse_args()
    if custom_comparator(args) and args.workers != 1:
        ap.error("--cnn-crops, --compare-weights and --compare-cnn need --workers 1 (worker "
                 "processes load the packaged comparator)")
    if custom_comparator(args) and args.shards:
        ap.error("--cnn-crops, --compare-weights and --compare-cnn do not apply to --shards "
                 "(the dedup command uses the packaged comparator)")
    from collapseguard.detectors.cnn_family import set_default_runtime

    set_default_runtime(args.runtime)  # this process, and the commands and workers it starts
    if args.tie is not None:
        if args.shards:
            ap.error("--tie applies to dedup in this process, not to --shards' command line")
        import collapseguard.dedup.run as dedup_run

        dedup_run.TIE = args.tie  # decide_groups reads it when it decides
    if args.framing_margin is not None:
        if args.shards:
            ap.error("--framing-margin applies to dedup in this process, not to --shards' command line")
        import collapseguard.dedup.groups as dedup_groups

        dedup_groups.FRAMING_MARGIN = args.framing_margin  # framed_apart reads it when it decides
    if args.octave_margin is not None:
        if args.shards:
            ap.error("--octave-margin applies to dedup in this process, not to --shards' command line")
        import collapseguard.dedup.run as dedup_run

        dedup_run.OCTAVE_MARGIN = args.octave_margin
    if args.throughput:
        return throughput_main(args)
    if args.chains:
        if not args.work:
            ap.error("--chains needs --work")
        return chains_main(args)
    if args.copy_kinds:
        if not args.work:
            ap.error("--copy-kinds needs --work")
        return copies_main(args)
    from collapseguard.dedup.groups import GroupingParams, group_ids

    t0 = time.perf_counter()
    hashes, thumbs, whashes, wthumbs, truth, planted = make(args.n, args.groups)
    t1, c1 = time.perf_counter(), time.process_time()
    if args.no_windows:  # the whole fingerprints alone: what the windows cost
        labels, stats = group_ids(hashes, thumbs, GroupingParams())
        stats.update(window_candidate_pairs=0, window_verified_pairs=0)
    else:
        labels, stats = group_ids(hashes, thumbs, GroupingParams(), whashes, wthumbs)
    t2, c2 = time.perf_counter(), time.process_time()
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    found = 0
    for g in np.unique(truth[truth >= 0]):
        rows = np.flatnonzero(truth == g)
        lab = labels[rows]
        # a copy is found when it shares a group with the most common group of its planted copies
        vals, counts = np.unique(lab[lab >= 0], return_counts=True)
        if vals.size:
            found += int((lab == vals[np.argmax(counts)]).sum())
    wrong = int(((truth < 0) & (labels >= 0)).sum())
    print(f"fingerprints: {args.n}  planted copies: {planted} in {args.groups} groups")
    print(f"made in {t1 - t0:.1f} s; grouped in {t2 - t1:.1f} s ({c2 - c1:.1f} s of CPU) "
          f"(candidates {stats['candidate_pairs']}, verified {stats['verified_pairs']}; of windows "
          f"{stats['window_candidate_pairs']}, verified {stats['window_verified_pairs']}; "
          f"groups {stats['groups']})")
    print(f"peak memory: {peak_gb:.2f} GB")
    print(f"planted copies found in their group: {found / planted:.4f}; unrelated fingerprints "
          f"in a group: {wrong} of {args.n - planted}")



COPY_KINDS = "crop1,crop2,crop3,crop5,crop10,resize60,upscale150,jpeg92,jpeg75,web85"


def _jpeg(img: Image.Image, quality: int) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality, subsampling=2)
    return buf.getvalue()


def copy_of(arr: np.ndarray, kind: str) -> tuple[bytes, str]:
    """The bytes and file suffix of a ``--copy-kinds`` copy of ``arr``."""
    img = Image.fromarray(arr)
    w, h = img.size
    m = re.fullmatch(r"([a-z]+)(\d+)", kind)
    if m is None:
        raise SystemExit(f"unknown kind {kind!r}")
    name, n = m.group(1), int(m.group(2))
    if name == "crop":
        dx, dy = round(w * n / 100), round(h * n / 100)
        out = img.crop((dx, dy, w - dx, h - dy))
    elif name == "resize":
        out = img.resize((round(w * n / 100), round(h * n / 100)), Image.LANCZOS)
    elif name == "upscale":
        out = img.resize((round(w * n / 100), round(h * n / 100)), Image.BICUBIC)
    elif name == "jpeg":
        return _jpeg(img, n), ".jpg"
    elif name == "web":
        small = img.resize((round(w * 0.7), round(h * 0.7)), Image.LANCZOS)
        small = Image.open(io.BytesIO(_jpeg(small, 80))).convert("RGB")
        return _jpeg(small.resize((w, h), Image.BICUBIC), n), ".jpg"
    elif name == "blur":
        out = img.filter(ImageFilter.GaussianBlur(n / 10))
    elif name == "noise":
        rng = np.random.default_rng(list(arr.shape) + [n])
        out = Image.fromarray(np.clip(arr + rng.normal(0, n, arr.shape), 0, 255).astype(np.uint8))
    elif name in ("resave", "classic"):
        rng = np.random.default_rng(list(arr.shape) + [n])
        for _ in range(max(1, n)):
            if name == "classic":
                x = np.asarray(img.filter(ImageFilter.GaussianBlur(1.0)), np.float64)
                img = Image.fromarray(np.clip(x + rng.normal(0, 3, x.shape), 0, 255).astype(np.uint8))
            data = _jpeg(img, 50 if name == "resave" else 70)
            img = Image.open(io.BytesIO(data)).convert("RGB")
        return data, ".jpg"
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    buf = io.BytesIO()
    out.save(buf, format="PNG")
    return buf.getvalue(), ".png"


def copy_kind_figures(photos, kind: str, work: Path, workers: int) -> dict:
    """One ``dedup`` run of the photos beside one copy of ``kind`` each: the share grouped, the
    share keeping the original, the range of ``p_worse``, and the copies' ``top_octave`` minus
    their original's (``octave_under_margin``: the share more than ``OCTAVE_MARGIN`` under it,
    which the larger-copy rule never keeps over the original)."""
    from collapseguard.dedup.run import OCTAVE_MARGIN, run_dedup
    from collapseguard.detectors.pair_features import top_octave
    from collapseguard.images import decode_image

    folder = work / kind / "images"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    octave = []  # top_octave of the copy minus the original's (what the larger-copy rule reads)
    for name, arr in photos:
        stem = name.replace("/", "_")
        Image.fromarray(arr).save(folder / f"{stem}__original.png")
        data, suffix = copy_of(arr, kind)
        (folder / f"{stem}__copy{suffix}").write_bytes(data)
        octave.append(top_octave(decode_image(data)) - top_octave(arr))
    out = work / kind / "dedup"
    if out.exists():
        shutil.rmtree(out)
    run_dedup([str(folder)], out, workers=workers, quiet=True)
    import pandas as pd
    t = pd.read_parquet(out / "groups.parquet")
    t["photo"] = t["key"].str.rsplit("__", n=1).str[0].str.rsplit("/", n=1).str[-1]
    t["role"] = t["key"].str.rsplit("__", n=1).str[1].str.split(".").str[0]
    grouped = kept = marked = copy_marked = 0
    p = []  # the other copy's p_worse (against its framing's least degraded copy: NaN for a crop of its own framing, left out)
    for _, g in t.groupby("photo"):
        roles = dict(zip(g["role"], zip(g["group"], g["rank"], g["decision"])))
        orig, copy = roles.get("original"), roles.get("copy")
        if orig is None or copy is None or not orig[0] or orig[0] != copy[0]:
            continue
        grouped += 1
        kept += orig[1] == 0
        marked += orig[2] == "degraded_copy"
        copy_marked += copy[2] == "degraded_copy"
        p += [float(x) for x in g["p_worse"] if x == x]
    n = len(photos)
    nan = float("nan")
    return {"kind": kind, "photos": n, "grouped": grouped / n,
            "original_kept": kept / grouped if grouped else nan,
            "original_marked_degraded": marked / grouped if grouped else nan,
            "copy_marked_degraded": copy_marked,
            "p_worse_min": min(p) if p else nan, "p_worse_max": max(p) if p else nan,
            "octave_diff_min": min(octave), "octave_diff_max": max(octave),
            "octave_under_margin": float(np.mean(np.array(octave) < -OCTAVE_MARGIN))}


#: the ``skimage.data`` images ``--pictures samples`` reads (those of short side 200 px or more)
SAMPLE_IMAGES = ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "retina",
                 "hubble_deep_field", "colorwheel", "logo", "cat", "horse", "camera", "moon", "brick",
                 "grass", "gravel", "checkerboard", "clock", "coins", "shepp_logan_phantom")


def sample_pictures() -> list[tuple[str, np.ndarray]]:
    """``--pictures samples``: skimage's sample images and scikit-learn's two, as RGB uint8."""
    import skimage.data as sd
    from sklearn.datasets import load_sample_images

    out = []
    for name in SAMPLE_IMAGES:
        a = np.asarray(getattr(sd, name)())
        if a.dtype != np.uint8:
            a = (np.clip(a, 0, 1) * 255).astype(np.uint8) if a.max() <= 1 else a.astype(np.uint8)
        a = np.stack([a] * 3, -1) if a.ndim == 2 else a[..., :3]
        if min(a.shape[:2]) >= 200:
            out.append((f"skimage/{name}", np.ascontiguousarray(a)))
    out += [(f"sklearn/{i}", a) for i, a in enumerate(load_sample_images().images)]
    return out


def copies_main(args) -> None:
    """``--copy-kinds``: each picture (``--pictures``) beside one copy of each kind, one ``dedup``
    run per kind."""
    from collapseguard.training_data_tools.sources import bundled_photos

    photos = bundled_photos(256) if args.pictures == "bundled" else sample_pictures()
    rows = [copy_kind_figures(photos, k, Path(args.work), args.workers) for k in args.copy_kinds.split(",")]
    import pandas as pd
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.3f}"))


def custom_comparator(args) -> bool:
    """Do the options ask for a comparator other than the packaged one?"""
    return bool(args.cnn_crops or args.compare_weights or args.compare_cnn)


def comparator(args):
    """The comparator with fingerprints: its cnn on ``--cnn-crops`` crops an image, its weights
    from ``--compare-weights`` and its cnn from ``--compare-cnn`` when given."""
    from collapseguard.detectors.base import create
    from collapseguard.detectors.compare import Comparator, comparator_cnn, load_weights

    if args.compare_cnn:
        cnn = create("cnn", weights=args.compare_cnn, n_crops=args.cnn_crops)
    elif args.cnn_crops:  # the cnn the weights read (with their mix), on fewer crops
        mix = load_weights(args.compare_weights)["meta"].get("cnn_mix")
        cnn = comparator_cnn(float(mix) if mix else None, n_crops=args.cnn_crops)
    else:
        cnn = None
    return Comparator(weights=args.compare_weights, fingerprints=True, cnn=cnn,
                      other_cnn=bool(args.compare_cnn or args.cnn_crops))


def throughput_main(args) -> None:
    import shutil
    import statistics
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from throughput import floor_phase, floor_task, load_line, make_shards

    from collapseguard.dedup.run import run_dedup
    workers = args.workers
    if args.cnn_batch:
        import collapseguard.dedup.describe as describe
        if workers != 1:
            raise SystemExit("--cnn-batch needs --workers 1")
        describe.CNN_BATCH = args.cnn_batch
    det = comparator(args) if workers == 1 else None  # loaded once, outside the timing
    floor, dedup, stages = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        make = make_shards if args.base == "crops" else distinct_shards
        shards = [str(p) for p in make(Path(tmp, "shards"), args.throughput)]
        if args.copy_share:
            shards = with_copies(shards, Path(tmp, "copies"), args.copy_share)
        print(f"at the start: {load_line()}", flush=True)
        for _ in range(args.rounds):
            if workers == 1:
                t = time.perf_counter()
                n = sum(floor_task(s) for s in shards)
                floor.append(n / (time.perf_counter() - t))
            else:
                ph = floor_phase(shards, workers)
                floor.append(ph["images"] / ph["seconds"])
            out = Path(tmp, "out")
            shutil.rmtree(out, ignore_errors=True)
            t = time.perf_counter()
            summary = run_dedup(shards, out, quiet=True, detector_obj=det, workers=workers,
                                weights=args.compare_weights, threads=args.threads or None)
            dedup.append(summary["images"] / (time.perf_counter() - t))
            stages.append(summary["seconds"])
        print(f"at the end: {load_line()}", flush=True)
        drift = reduced_drift(shards)
    f, d = statistics.median(floor), statistics.median(dedup)
    procs = (f"one process, {args.threads or 'torch default'} thread(s)" if workers == 1
             else f"{workers} processes")
    per_round = [b / a for a, b in zip(floor, dedup)]
    print(f"{summary['images']} images 1024x768 JPEG ({args.base} base, "
          f"{summary['grouped'] / summary['images']:.2f} grouped), {procs}, {args.rounds} rounds (medians): "
          f"plain decode {f:.1f} images/s, dedup {d:.2f} images/s, ratio {d / f:.3f}x "
          f"(rounds {min(per_round):.3f}x-{max(per_round):.3f}x); "
          f"{summary['grouped']} images in {summary['groups']} groups, {summary['described']} described "
          "by the comparator")
    med = {k: statistics.median(s[k] for s in stages) for k in stages[0]}
    per = lambda k, n: f"{med[k] * 1e3 / n:.1f} ms" if n else "-"  # noqa: E731
    print(f"stages (medians): fingerprint pass {per('fingerprint', summary['images'])} per image, "
          f"grouping {med['group'] * 1e3:.0f} ms, comparator pass "
          f"{per('describe', summary['described'])} per described image, decisions and outputs "
          f"{med['decide'] * 1e3:.0f} ms; plain decode {1e3 / f:.1f} ms per image")
    bits, corr = drift
    print(f"fingerprints of the reduced JPEG decoding against the full decoding's: hash bits that "
          f"differ: mean {bits.mean():.2f}, max {bits.max()} ({np.mean(bits == 0):.3f} identical); "
          f"thumbnail correlation: min {corr.min():.4f}")


#: (zoom, grid) of ``distinct_shards``' framings: at zoom z the crop spans 1/z of the covering
#: size a side, on a grid x grid of corner positions; neighbours overlap by up to half a side, but
#: no framing is a central window of another, which is what dedup's crop windows match
FRAMINGS = ((1.0, 1), (1.5, 2), (2.0, 2))


def _add_member(tf, name: str, data: bytes) -> None:
    """Append one member ``name`` holding ``data`` to the open tar ``tf``."""
    import tarfile

    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def distinct_shards(root: Path, n: int, seed: int = 0) -> list[Path]:
    """``n`` 1024x768 JPEG q92 4:2:0 images in shards of 50, as ``throughput.make_shards`` writes
    them, each a framing no other image shares: a bundled photo under one of its 8 flips and
    rotations, at one zoom and grid position of ``FRAMINGS`` (up to 16 x 8 x 9 = 1,152 images;
    the retina and the colour wheel are left out: their zoomed corners are flat black or one
    hue, so every flip of one is the same picture)."""
    import tarfile

    from PIL import Image

    from collapseguard.training_data_tools.sources import bundled_photos

    w, h = 1024, 768
    photos = [Image.fromarray(im) for name, im in bundled_photos(min_side=256)
              if not name.endswith(("retina", "color"))]
    slots = [(p, d, z, gx, gy) for p in range(len(photos)) for d in range(8)
             for z, grid in FRAMINGS for gx in range(grid) for gy in range(grid)]
    if n > len(slots):
        raise SystemExit(f"--base distinct makes at most {len(slots)} images")
    rng = np.random.default_rng(seed)
    chosen = [slots[k] for k in rng.choice(len(slots), n, replace=False)]
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(0, n, 50):
        path = root / f"distinct-{k // 50:04d}.tar"
        with tarfile.open(path, "w") as tf:
            for i, (p, d, z, gx, gy) in enumerate(chosen[k: k + 50], start=k):
                src = photos[p].rotate(90 * (d % 4), expand=True)
                if d >= 4:
                    src = src.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
                scale = max(w / src.width, h / src.height) * z
                big = src.resize((round(src.width * scale), round(src.height * scale)), Image.BICUBIC)
                grid = dict(FRAMINGS)[z]
                # the grid's corners, or centred when the zoom has one framing
                x = round(gx * (big.width - w) / (grid - 1)) if grid > 1 else (big.width - w) // 2
                y = round(gy * (big.height - h) / (grid - 1)) if grid > 1 else (big.height - h) // 2
                buf = io.BytesIO()
                big.crop((x, y, x + w, y + h)).save(buf, "JPEG", quality=92, subsampling=2)
                for name, data in ((f"{i:06d}.jpg", buf.getvalue()), (f"{i:06d}.txt", b"a caption")):
                    _add_member(tf, name, data)
        paths.append(path)
    return paths


def reduced_drift(shards: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per JPEG of ``shards``: the hash bits and the thumbnail correlation between the fingerprint
    of its reduced decoding (what ``dedup`` fingerprints) and of its full decoding."""
    import tarfile

    from collapseguard.detectors.fingerprint import (
        REDUCED_SIDE,
        correlation,
        fingerprint,
        hamming,
    )
    from collapseguard.images import decode_detailed, decode_reduced

    bits, corr = [], []
    for s in shards:
        with tarfile.open(s) as tf:
            for m in tf:
                if m.name.endswith(".jpg"):
                    data = tf.extractfile(m).read()
                    h1, t1 = fingerprint(decode_detailed(data)[0])
                    h2, t2 = fingerprint(decode_reduced(data, REDUCED_SIDE)[0])
                    bits.append(int(hamming(np.uint64(h1), np.uint64(h2))))
                    corr.append(float(correlation(t1, t2)))
    return np.array(bits), np.array(corr)


def with_copies(shards: list[str], root: Path, share: float, seed: int = 1) -> list[str]:
    """The images of ``shards`` with copies added so that about ``share`` of all images are in a
    group: each copy is an earlier image resized x0.8 and stored as JPEG q75 (an image and its
    copy make a group of two). The copies go at random places; shards of 50 images."""
    import io
    import tarfile

    from PIL import Image

    rng = np.random.default_rng(seed)
    images = []
    for s in shards:
        with tarfile.open(s) as tf:
            images += [tf.extractfile(m).read() for m in tf if m.name.endswith(".jpg")]
    n_copies = int(round(len(images) * share / (2 - share)))  # 2 * copies / (images + copies)
    out = list(images)
    for j in rng.choice(len(images), n_copies, replace=False):
        im = Image.open(io.BytesIO(images[j])).convert("RGB")
        im = im.resize((round(im.width * 0.8), round(im.height * 0.8)), Image.LANCZOS)
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=75)
        out.insert(int(rng.integers(0, len(out) + 1)), buf.getvalue())
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(0, len(out), 50):
        p = root / f"copies-{k // 50:04d}.tar"
        with tarfile.open(p, "w") as tf:
            for i, data in enumerate(out[k: k + 50], start=k):
                for name, blob in ((f"{i:06d}.jpg", data), (f"{i:06d}.txt", b"a caption")):
                    _add_member(tf, name, blob)
        paths.append(str(p))
    return paths


def _hashes(img) -> dict:
    """pHash (the one dedup uses), dHash (horizontal gradient signs at 9 x 8) and aHash (8 x 8
    mean), each 64 bits, from the same luminance."""
    from PIL import Image

    from collapseguard.detectors.fingerprint import luminance, phash
    grey = Image.fromarray(np.clip(luminance(img), 0, 255).astype(np.uint8))
    d = np.asarray(grey.resize((9, 8), Image.Resampling.LANCZOS), np.float64)
    a = np.asarray(grey.resize((8, 8), Image.Resampling.LANCZOS), np.float64)
    pack = lambda bits: int(np.packbits(bits.ravel()).view(">u8")[0])  # noqa: E731
    return {"phash": phash(img), "dhash": pack(d[:, 1:] > d[:, :-1]), "ahash": pack(a > a.mean())}


def compare_hashes(images: Path, index: dict, max_distance: int = 8) -> None:
    """Per hash: the share of chain images within ``max_distance`` bits of one of their picture's
    step-0 images, and the share of pairs of different pictures' step-0 (or unrelated) images
    within it (candidates the verification must turn away)."""
    from collapseguard.detectors.fingerprint import hamming
    from collapseguard.images import load_image

    names = sorted(index)
    hs = {n: _hashes(load_image(images / n)) for n in names}
    print(f"hashes (within {max_distance} bits): chain images near their step 0 | "
          "pairs of different pictures near each other")
    for kind in ("phash", "dhash", "ahash"):
        step0: dict[str, list[int]] = defaultdict(list)
        for n in names:
            if index[n]["kind"] in ("chain", "unrelated") and index[n]["step"] == 0:
                step0[index[n]["picture"]].append(hs[n][kind])
        near = [min(int(hamming(np.uint64(hs[n][kind]), np.uint64(h))) for h in step0[index[n]["picture"]])
                <= max_distance for n in names if index[n]["kind"] == "chain" and index[n]["step"] > 0]
        pics = sorted(step0)
        first = np.array([step0[p][0] for p in pics], np.uint64)
        d = hamming(first[:, None], first[None, :])
        iu = np.triu_indices(len(pics), 1)
        print(f"  {kind}: {np.mean(near):.4f} of {len(near)} | {np.mean(d[iu] <= max_distance):.5f} "
              f"of {len(iu[0])}")


def chains_main(args) -> None:

    import pyarrow.parquet as pq

    from collapseguard.dedup.copies import random_copy
    from collapseguard.dedup.run import run_dedup
    from collapseguard.images import load_image
    from collapseguard.training_data_tools.manifest import read_manifest
    from collapseguard.training_data_tools.sources import resolve_sources

    rng = np.random.default_rng(args.seed)
    work = Path(args.work)
    images = work / "images"
    index_path = work / "index.json"
    df = read_manifest(args.chains)
    df = df[df["step"] <= args.max_step]
    if args.held_out:
        from collapseguard.training_data_tools.manifest import source_bucket
        df = df[[source_bucket(s) >= 0.6 for s in df["source_image"]]]
    if args.max_sources:
        keep = sorted(df["source_image"].unique())
        keep = set(rng.permutation(keep)[: args.max_sources].tolist())
        df = df[df["source_image"].isin(keep)]
    if not index_path.exists():
        images.mkdir(parents=True, exist_ok=True)
        index = {}
        names = rng.permutation(10 ** 7)
        n = 0

        def put(data: bytes, ext: str, info: dict) -> None:
            nonlocal n
            name = f"{names[n]:07d}.{ext}"
            n += 1
            (images / name).write_bytes(data)
            index[name] = info

        for r in df.itertuples():
            p = Path(r.path)
            put(p.read_bytes(), p.suffix.lstrip("."), {"picture": r.source_image, "family": r.family,
                                                       "step": int(r.step), "kind": "chain"})
        step0 = df[df["step"] == 0].drop_duplicates("source_image")
        for r in step0.itertuples():
            img = load_image(r.path)
            for _ in range(args.copies):
                label, data, _ = random_copy(img, rng)
                ext = "png" if "png" in label else "jpg" if "jpeg" in label else "webp"
                put(data, ext, {"picture": r.source_image, "family": "", "step": 0, "kind": "copy"})
        from collapseguard.images import encode_png
        for name, arr in resolve_sources(args.unrelated, seed=args.unrelated_seed) if args.unrelated else []:
            put(encode_png(arr), "png", {"picture": f"unrelated/{name}", "family": "", "step": 0,
                                          "kind": "unrelated"})
        index_path.write_text(json.dumps(index))
    index = json.loads(index_path.read_text())
    t0 = time.perf_counter()
    if args.shards:
        shards = pack_shards(images, work / "shards", args.shards)
        cli(["dedup", *shards, "--out", work / "dedup", "-w", args.workers, "-q",
             "--runtime", args.runtime])
        seconds = time.perf_counter() - t0
        summary = json.loads((work / "dedup" / "summary.json").read_text())
        rows = pq.read_table(work / "dedup" / "groups.parquet").to_pylist()
        by_key = {name.split(".")[0]: info for name, info in index.items()}
        if sorted(r["key"] for r in rows) != sorted(by_key):
            raise SystemExit("dedup's table does not hold exactly one row per image of the shards")
        for r in rows:
            r.update(by_key[r["key"]])
    else:
        summary = run_dedup([str(images)], work / "out", workers=args.workers, quiet=True,
                            weights=args.compare_weights,
                            detector_obj=comparator(args) if custom_comparator(args) else None)
        seconds = time.perf_counter() - t0
        rows = pq.read_table(work / "out" / "groups.parquet").to_pylist()
        for r in rows:
            r.update(index[Path(r["key"]).name if r["key"] not in index else r["key"]])
    by_group = defaultdict(list)
    for r in rows:
        if r["group"]:
            by_group[r["group"]].append(r)
    majority = {g: Counter(m["picture"] for m in ms).most_common(1)[0][0] for g, ms in by_group.items()}
    step0_group = {}
    for r in rows:
        if r["kind"] == "chain" and r["step"] == 0:
            step0_group.setdefault(r["picture"], set()).add(r["group"])
    joined = defaultdict(list)
    for r in rows:
        if r["kind"] == "chain":
            g0 = step0_group.get(r["picture"], set())
            joined[(r["family"], r["step"])].append(bool(r["group"]) and r["group"] in g0)
    wrong = [bool(r["group"]) and majority[r["group"]] != r["picture"] for r in rows]
    wrong_unrel = [w for w, r in zip(wrong, rows) if r["kind"] == "unrelated"]
    # ranking inside groups: per family, step 0 vs >= 3 and step 1 vs 5 of one chain-set (picture)
    order0, order15, drop5 = defaultdict(list), defaultdict(list), defaultdict(list)
    cnn0 = defaultdict(list)  # the same pairs ordered by the cnn's score alone
    for g, ms in by_group.items():
        for fam in {m["family"] for m in ms if m["kind"] == "chain"}:
            fm = [m for m in ms if m["family"] == fam and m["kind"] == "chain"]
            for a in fm:
                for b in fm:
                    if a["step"] == 0 and b["step"] >= 3:
                        order0[fam].append(a["rank"] < b["rank"])
                        cnn0[fam].append(a["cnn"] < b["cnn"])
                    if a["step"] == 1 and b["step"] == 5:
                        order15[fam].append(a["rank"] < b["rank"])
    for r in rows:
        if r["kind"] == "chain" and r["step"] >= 5:
            drop5[r["family"]].append(r["decision"] == "degraded_copy")
    where = "one folder"
    if args.shards:
        spread = defaultdict(set)
        for r in rows:
            if r["kind"] != "unrelated":
                spread[r["picture"]].add(r["shard"])
        n = [len(v) for v in spread.values()]
        where = (f"{args.shards} shards, each picture's images in {min(n)}-{max(n)} of them "
                 f"(median {np.median(n):g})")
    print(f"images: {len(rows)} in {where} ({sum(r['kind'] == 'chain' for r in rows)} chain, "
          f"{sum(r['kind'] == 'copy' for r in rows)} harmless copies, "
          f"{sum(r['kind'] == 'unrelated' for r in rows)} unrelated); dedup {seconds:.0f} s; "
          f"groups {summary['groups']}; level {summary['level']:.4f}")
    steps = sorted({k[1] for k in joined})
    fams = sorted({k[0] for k in joined})
    print("joined their picture's group, by family and step: " + " ".join(f"step{s}" for s in steps))
    for f in fams:
        print(f"  {f:18s} " + " ".join(f"{np.mean(joined[(f, s)]):.3f}" for s in steps))
    allj = [v for vs in joined.values() for v in vs]
    print(f"chain images at steps <= {args.max_step} in their picture's group: {np.mean(allj):.4f} of {len(allj)}")
    print(f"images in a wrong group: {np.mean(wrong):.4f} of {len(rows)}; unrelated pictures in a "
          f"wrong group: {np.mean(wrong_unrel) if wrong_unrel else float('nan'):.4f} of {len(wrong_unrel)}")
    print("inside groups, by family: step0<step>=3 ranked right (by the cnn alone) | step1<step5 | "
          "step>=5 marked degraded_copy")
    for f in fams:
        print(f"  {f:18s} {np.mean(order0[f]) if order0[f] else float('nan'):.3f} "
              f"({np.mean(cnn0[f]) if cnn0[f] else float('nan'):.3f}; {len(order0[f])}) | "
              f"{np.mean(order15[f]) if order15[f] else float('nan'):.3f} ({len(order15[f])}) | "
              f"{np.mean(drop5[f]) if drop5[f] else float('nan'):.3f} ({len(drop5[f])})")
    if args.shards:
        filter_figures(args, rows, shards, work, fams)
    else:
        cnn_figures(rows, fams, images)
    if args.hashes:
        compare_hashes(images, index)
    s0 = [r["decision"] == "degraded_copy" for r in rows if r["kind"] == "chain" and r["step"] == 0]
    cp = [r["decision"] == "degraded_copy" for r in rows if r["kind"] == "copy"]
    print(f"marked degraded_copy: step-0 images {np.mean(s0):.4f} of {len(s0)}; harmless copies "
          f"{np.mean(cp) if cp else float('nan'):.4f} of {len(cp)}")
    # the copy each group keeps (rank 0), which `filter --groups --drop-duplicates` alone keeps
    kept = Counter()
    for ms in by_group.values():
        k = next(m for m in ms if m["rank"] == 0)
        kept["a harmless copy" if k["kind"] == "copy" else "unrelated" if k["kind"] != "chain"
             else "step 0" if k["step"] == 0 else "step 1-2" if k["step"] <= 2 else "step >= 3"] += 1
    print("kept copy of each group: " + ", ".join(
        f"{name} {kept[name]}" for name in ("step 0", "a harmless copy", "step 1-2", "step >= 3", "unrelated")
        if kept[name] or name != "unrelated") + f" of {len(by_group)} groups")


def cnn_figures(rows: list[dict], fams: list[str], images: Path) -> None:
    """What ``filter`` would reject: the shipped cnn at its shipped threshold alone, and with
    ``--groups`` (a degraded copy is rejected too). Every image is scored by the shipped cnn (the
    table's ``cnn`` column is the comparator's own cnn, other weights)."""
    from collapseguard.calibration.thresholds import resolve_threshold
    from collapseguard.detectors import create
    from collapseguard.images import load_image

    det = create("cnn")
    threshold = resolve_threshold(det)[0]
    score = {}
    for i in range(0, len(rows), 16):
        batch = rows[i: i + 16]
        got = det.score([load_image(images / Path(r["key"]).name) for r in batch])
        score.update({r["key"]: float(v) for r, v in zip(batch, got)})
    print(f"rejected, cnn {det.version} at its shipped threshold {threshold:.4f} | the same with --groups:")
    for label, pick in [(f, lambda r, f=f: r["kind"] == "chain" and r["family"] == f and r["step"] >= 5)
                        for f in fams] + [("clean (step 0, copies, unrelated)",
                                           lambda r: r["step"] == 0)]:
        sel = [r for r in rows if pick(r)]
        noref = [score[r["key"]] > threshold for r in sel]
        both = [score[r["key"]] > threshold or r["decision"] == "degraded_copy" for r in sel]
        print(f"  {label:18s} {np.mean(noref):.3f} | {np.mean(both):.3f} ({len(sel)})")


def cli(args: list) -> None:
    """``collapseguard ARGS`` in a subprocess (this Python, the package it imports), checked."""
    import subprocess
    import sys

    cmd = [sys.executable, "-c", "from collapseguard.cli import main; main()", *map(str, args)]
    subprocess.run(cmd, check=True)


def pack_shards(images: Path, root: Path, n: int) -> list[str]:
    """The files of ``images`` as WebDataset shards ``root/shard-NNNN.tar``: one sample per file
    (its name is the member's name, its stem the key: unique random names), the bytes as stored,
    in name order (a shuffle of the order they were made in) cut into ``n`` shards of nearly equal
    size. A folder that ``shards.json`` marks complete for ``n`` is reused."""
    import tarfile

    done = root / "shards.json"
    if done.exists() and json.loads(done.read_text())["n"] == n:
        return json.loads(done.read_text())["shards"]
    names = sorted(p.name for p in images.iterdir() if p.is_file())
    keys = [name.split(".")[0] for name in names]
    if len(set(keys)) != len(keys):
        raise SystemExit(f"{images}: two files share a key")
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, part in enumerate(np.array_split(np.array(names, dtype=object), n)):
        path = root / f"shard-{i:04d}.tar"
        tmp = path.with_suffix(".tar.tmp")
        with tarfile.open(tmp, "w") as tf:
            for name in part:
                data = (images / name).read_bytes()
                _add_member(tf, name, data)
        tmp.replace(path)
        paths.append(str(path))
    done.write_text(json.dumps({"n": n, "shards": paths}))
    return paths


def _members(path) -> list[tuple[str, str]]:
    """(name, SHA-256 of the bytes) of each regular member of a tar shard, in order."""
    import hashlib
    import tarfile

    with tarfile.open(path) as tf:
        return [(m.name, hashlib.sha256(tf.extractfile(m).read()).hexdigest()) for m in tf if m.isfile()]


def filter_decisions(out: Path) -> dict[str, dict]:
    """key -> scores row of a ``filter`` output (keys are unique across its shards here)."""
    import pyarrow.parquet as pq

    rows = pq.read_table(sorted((out / "scores").glob("*.parquet"))).to_pylist()
    by_key = {r["key"]: r for r in rows}
    if len(by_key) != len(rows):
        raise SystemExit(f"{out}: a key is in the scores table twice")
    return by_key


def conservation(shards: list[str], out: Path) -> dict[str, int]:
    """Check that the ``filter`` output ``out`` conserves the members of ``shards``: each input
    member (by name, with its bytes' SHA-256) is in exactly one of out/kept/ and out/rejected/,
    byte for byte, on the side its sample's scores row decides; nothing else is there; the
    summary counts every sample. Returns the counts; raises SystemExit naming what is wrong."""
    inputs: dict[str, str] = {}
    problems = []
    for s in shards:
        for name, digest in _members(s):
            if name in inputs:
                problems.append(f"input member {name} twice")
            inputs[name] = digest
    found: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for side in ("kept", "rejected"):
        for path in sorted((out / side).glob("*.tar")):
            for name, digest in _members(path):
                found[name].append((side, digest))
    decisions = filter_decisions(out)
    for name, digest in inputs.items():
        where = found.get(name, [])
        if not where:
            problems.append(f"{name}: lost")
        elif len(where) > 1:
            problems.append(f"{name}: {len(where)} copies in {[w[0] for w in where]}")
        elif where[0][1] != digest:
            problems.append(f"{name}: bytes changed in {where[0][0]}/")
        elif decisions.get(name.split(".")[0], {}).get("decision") != where[0][0]:
            problems.append(f"{name}: in {where[0][0]}/, its scores row says "
                            f"{decisions.get(name.split('.')[0], {}).get('decision')}")
    problems += [f"{name}: in the output, not in the input" for name in found if name not in inputs]
    keys = {name.split(".")[0] for name in inputs}
    if set(decisions) != keys:
        problems.append(f"scores table keys differ from the input's ({len(decisions)} vs {len(keys)})")
    summary = json.loads((out / "summary.json").read_text())
    if summary["shards_failed"] or summary["samples"] != len(keys) or \
            summary["kept"] + summary["rejected"] != len(keys):
        problems.append(f"summary.json: {summary['samples']} samples, {summary['kept']} kept, "
                        f"{summary['rejected']} rejected, failed {summary['shards_failed']} "
                        f"for {len(keys)} input samples")
    if problems:
        raise SystemExit(f"conservation FAILED in {out}: {len(problems)} problem(s):\n  "
                         + "\n  ".join(problems[:20]))
    return {"members": len(inputs),
            "kept": sum(1 for w in found.values() if w[0][0] == "kept"),
            "rejected": sum(1 for w in found.values() if w[0][0] == "rejected")}


def filter_figures(args, rows: list[dict], shards: list[str], work: Path, fams: list[str]) -> None:
    """Run ``filter`` on the shards with ``--groups`` and without (the cnn at its shipped
    threshold), print the share of step >= 5 images each rejects per family and of the clean
    images, and check that each output conserves every member."""
    import hashlib

    table = work / "dedup" / "groups.parquet"
    digest = hashlib.sha256(table.read_bytes()).hexdigest()[:12]  # a new table, a new output
    outs = {"groups": work / f"filter_groups-{digest}", "plain": work / "filter_plain"}
    seconds = {}
    for name, extra in (("groups", ["--groups", table]), ("plain", [])):
        t = time.perf_counter()
        cli(["filter", *shards, "--out", outs[name], "-w", args.workers, "-q", *extra])
        seconds[name] = time.perf_counter() - t
    dec = {name: filter_decisions(out) for name, out in outs.items()}
    summaries = {name: json.loads((out / "summary.json").read_text()) for name, out in outs.items()}
    plain = summaries["plain"]
    print(f"filter ({seconds['plain']:.0f} s | --groups {seconds['groups']:.0f} s): rejected by the "
          f"{plain['detector']} at its shipped threshold {plain['threshold']:.4f} "
          "alone | with --groups (of those for degraded_copy):")
    picks = [(f, lambda r, f=f: r["kind"] == "chain" and r["family"] == f and r["step"] >= 5) for f in fams]
    picks += [("clean: step-0 chain", lambda r: r["kind"] == "chain" and r["step"] == 0),
              ("clean: harmless copy", lambda r: r["kind"] == "copy"),
              ("clean: unrelated", lambda r: r["kind"] == "unrelated"),
              ("clean: all", lambda r: r["step"] == 0)]
    for label, pick in picks:
        keys = [r["key"] for r in rows if pick(r)]
        if not keys:
            continue
        share = {name: np.mean([dec[name][k]["decision"] == "rejected" for k in keys]) for name in dec}
        dc = np.mean([dec["groups"][k]["reason"] == "degraded_copy" for k in keys])
        print(f"  {label:20s} {share['plain']:.3f} | {share['groups']:.3f} ({dc:.3f}) of {len(keys)}")
    for name, out in outs.items():
        c = conservation(shards, out)
        print(f"conservation, filter {'--groups' if name == 'groups' else 'alone'}: {c['members']} input "
              f"members -> {c['kept']} kept + {c['rejected']} rejected, each once, byte-identical "
              f"(SHA-256), on its scores row's side; reasons {summaries[name]['reasons']}")


if __name__ == "__main__":
    main()
