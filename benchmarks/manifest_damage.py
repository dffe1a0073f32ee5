"""How much did the chains in a manifest change? PSNR of step k to step 0, per source kind and family.

    python benchmarks/manifest_damage.py CHAINS_DIR [CHAINS_DIR ...] [--step 10]

For chains already made (``collapseguard chains make``, benchmarks/fresh_set.sh,
make_default_calibration.sh): the median over chains of PSNR(step 0, step k) per (source kind,
family), and how many chains are pixel-identical at step k (infinite PSNR; no detector can rank
them). The source kind is the source name up to its first "-" or "/" (``wp`` photos, ``art``,
``tex``, ...). Chains whose size changed (aspect drift) are left out of the median and counted.
Where chain_damage.py asks what each family does to a standard image, this asks what the chains of
a given set actually contain.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from collapseguard.images import load_image
from collapseguard.training_data_tools.manifest import read_manifest


def damage_table(chains_dir: str, step: int) -> pd.DataFrame:
    m = read_manifest(chains_dir)
    m = m[m["step"].isin([0, step])]
    rows = []
    for cid, g in m.groupby("chain_id", sort=True):
        g = g.set_index("step")
        if step not in g.index:
            continue
        a, b = load_image(g.loc[0, "path"]), load_image(g.loc[step, "path"])
        kind = str(g.loc[0, "source_image"]).replace("/", "-").split("-")[0]
        if a.shape != b.shape:
            psnr = np.nan
        else:
            mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
            psnr = np.inf if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)
        rows.append({"kind": kind, "family": g.loc[0, "family"], "psnr": psnr})
    df = pd.DataFrame(rows)
    out = df.groupby(["kind", "family"]).agg(
        chains=("psnr", "size"),
        median_psnr=("psnr", lambda s: float(np.median(s.dropna())) if s.notna().any() else np.nan),
        identical=("psnr", lambda s: int(np.isinf(s).sum())),
        resized=("psnr", lambda s: int(s.isna().sum())))
    return out.reset_index()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("chains", nargs="+")
    ap.add_argument("--step", type=int, default=10)
    args = ap.parse_args(argv)
    for d in args.chains:
        t = damage_table(d, args.step)
        print(f"# {d}: PSNR of step {args.step} to step 0 (median over chains)")
        print(t.pivot(index="family", columns="kind", values="median_psnr").round(1).to_string())
        print("identical at step", args.step, "(chains):")
        print(t.pivot(index="family", columns="kind", values="identical").to_string())
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
