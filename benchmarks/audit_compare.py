"""``audit --compare`` in one pass (ComparePanel) against one scoring pass per detector.

    python benchmarks/audit_compare.py [--images 200] [--repeats 2] [--main nss] [--other cnn]

Shards of 1024x768 JPEG photos (as in throughput.py). In one process, alternating: (a) one
``run_score`` pass whose detector is a ``ComparePanel`` of main + other (each image read and
decoded once, what ``audit -w 1 --compare`` does) and (b) two passes, one per detector (what it
did before, and still does with worker processes). Prints the median seconds of each and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import make_shards  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--main", default="nss")
    ap.add_argument("--other", default="cnn")
    args = ap.parse_args()
    from collapseguard.audit.panel import ComparePanel
    from collapseguard.detectors import create
    from collapseguard.scoring.run import run_score

    main_det, other_det = create(args.main), create(args.other)
    panel = ComparePanel(main_det, {args.other: other_det})
    with tempfile.TemporaryDirectory() as tmp:
        shards = make_shards(Path(tmp), args.images)
        one, two = [], []
        for _ in range(args.repeats):
            t = time.perf_counter()
            df, _ = run_score(shards, args.main, workers=1, quiet=True, detector_obj=panel)
            one.append(time.perf_counter() - t)
            assert df[f"score:{args.other}"].notna().all()
            t = time.perf_counter()
            run_score(shards, args.main, workers=1, quiet=True, detector_obj=main_det)
            run_score(shards, args.other, workers=1, quiet=True, detector_obj=other_det)
            two.append(time.perf_counter() - t)
    a, b = statistics.median(one), statistics.median(two)
    print(f"{args.images} images 1024x768, main {args.main}, compared {args.other}, 1 process")
    print(f"one pass (ComparePanel): {a:.2f} s   one pass per detector: {b:.2f} s   "
          f"ratio one/separate: {a / b:.2f}")


if __name__ == "__main__":
    main()
