"""Copy cnn weights with inference options of their config changed, the tensors untouched.

    python recipes/set_net_config.py IN.safetensors OUT.safetensors [--mirror | --no-mirror] [--n-crops K]

``--mirror`` scores every crop and its left-right mirror image together (``NetConfig.mirror``),
``--n-crops`` the crops per image. Options that change the tensors (width, stem, context) cannot
be set here. The copy's version differs from the input's, so it needs its own calibration
(``collapseguard calibrate --detector cnn:OUT``).
"""

from __future__ import annotations

import argparse
import dataclasses

from collapseguard.detectors.cnn_model import load_net, save_net


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--mirror", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--n-crops", type=int)
    args = ap.parse_args(argv)
    with open(args.src, "rb") as f:
        net, meta = load_net(f.read())
    changes = {k: v for k, v in (("mirror", args.mirror), ("n_crops", args.n_crops)) if v is not None}
    net.config = dataclasses.replace(net.config, **changes)
    meta = {k: v for k, v in meta.items() if k not in ("format", "config")}
    meta["derived_from"] = f"{args.src} with {changes}"
    save_net(net, args.dst, meta)
    print(f"{args.dst}: {net.config}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
