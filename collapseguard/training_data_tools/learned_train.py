"""Train the learned replicator's autoencoder (short, seeded, CPU).

    python -m collapseguard.training_data_tools.learned_train \
        --out collapseguard/weights/replicator_ae.safetensors

A denoising autoencoder on random 48x48 patches of the bundled photos and procedural art (input:
patch + Gaussian noise of random level, target: the clean patch), Adam, fixed seed, one thread.
Takes minutes on one CPU core; prints the loss as it goes and the final PSNR of one
pass on held-out patches.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def patches(images: list[np.ndarray], n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """n random (size x size) crops with random flips, as float32 (n, 3, size, size) in [0, 1]."""
    out = np.empty((n, 3, size, size), np.float32)
    for i in range(n):
        img = images[int(rng.integers(len(images)))]
        y = int(rng.integers(0, img.shape[0] - size + 1))
        x = int(rng.integers(0, img.shape[1] - size + 1))
        crop = img[y:y + size, x:x + size]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        out[i] = crop.transpose(2, 0, 1) / 255.0
    return out


def train(out: Path, steps: int = 1500, batch: int = 24, size: int = 48, seed: int = 0,
          lr: float = 2e-3, n_art: int = 24, photos: bool = True) -> dict:
    """Train and save the autoencoder; returns ``{"psnr": held-out one-pass PSNR}``."""
    out = Path(out)
    import torch
    from safetensors.torch import save_file

    from collapseguard.io.atomic import replaced_when_done
    from collapseguard.training_data_tools.replicators.learned import build_model
    from collapseguard.training_data_tools.sources import bundled_photos, procedural_art

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    images = [a for _, a in bundled_photos()] if photos else []
    images += [a for _, a in procedural_art(n_art, seed=seed, min_side=160, max_side=400)]
    held = patches(images, 256, size, np.random.default_rng(seed + 1))
    model = build_model()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    t0 = time.time()
    for it in range(1, steps + 1):
        clean = torch.from_numpy(patches(images, batch, size, rng))
        sigma = torch.from_numpy(rng.uniform(0, 0.04, (batch, 1, 1, 1)).astype(np.float32))
        noisy = clean + sigma * torch.randn(clean.shape, generator=torch.Generator().manual_seed(seed * 100003 + it))
        loss = torch.nn.functional.l1_loss(model(noisy), clean)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if it % 250 == 0 or it == 1:
            print(f"step {it:5d}  l1 {loss.item():.4f}  {time.time() - t0:.0f}s", flush=True)
    model.eval()
    with torch.inference_mode():
        h = torch.from_numpy(held)
        mse = torch.mean((model(h).clamp(0, 1) - h) ** 2).item()
    psnr = 10 * np.log10(1.0 / max(mse, 1e-12))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    with replaced_when_done(out, suffix=".safetensors.tmp") as tmp:  # the umask's mode, not 0600
        save_file(state, tmp, metadata={"arch": "ReplicatorAE-v1", "seed": str(seed),
                                        "steps": str(steps), "heldout_psnr": f"{psnr:.2f}"})
    print(f"saved {out}  held-out one-pass PSNR {psnr:.2f} dB  ({time.time() - t0:.0f}s)")
    return {"psnr": psnr}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("collapseguard/weights/replicator_ae.safetensors"))
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    train(args.out, steps=args.steps, seed=args.seed)


if __name__ == "__main__":
    main()
