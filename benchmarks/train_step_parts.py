"""Time the parts of one cnn training step, the current code beside the code it replaced, in one run.

    python benchmarks/train_step_parts.py [--repeats 30] [--threads 2]

One batch of the shipped recipe: 48 images x 6 crops of 48 px (288 crops). Printed per part, in
ms per batch: the box mean (torch's stride-1 ``avg_pool2d`` vs ``cnn_model._box_means``), the
per-crop standard deviation (``torch.std`` vs ``cnn_model._spatial_std``, which ``_inputs`` uses), the whole input
preparation (``_inputs``), and forward + backward of the conv body with the input as it comes
(NCHW) vs channels-last (what ``crop_logits`` does now). Then the whole network's forward +
backward at widths 16 and 32, float32 vs bfloat16 autocast (``collapseguard train --precision
bf16``; the gain needs a CPU with AVX512-BF16 or AMX, and ``bf16 supported`` says whether torch
sees one). The ratios are what to read; absolute
times vary on a shared machine. The whole-step effect is in the training logs: 12,000 iterations
took 635 s with the old code, and 16,000 took 538 s with the new (MODEL_CARD.md).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from collapseguard.detectors.cnn_model import (
    DegradationNet,
    NetConfig,
    _box_means,
    _spatial_std,
)


def _ms(fn, repeats: int) -> float:
    """Mean ms per call. The last two results stay alive, as they do in a training step where the
    next operation consumes them: freeing a multi-MB result at once hands its pages back to the OS,
    and the next call's page faults would then dominate (and make runs bimodal)."""
    kept = [fn(), fn()]
    t = time.perf_counter()
    for i in range(repeats):
        kept[i % 2] = fn()
    return (time.perf_counter() - t) / repeats * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    net = DegradationNet()
    net.train()
    crops = torch.randint(0, 256, (288, 48, 48, 3), dtype=torch.uint8)
    x = crops.permute(0, 3, 1, 2).contiguous().float().mul(1 / 255)

    inp, colour = net._inputs(crops)

    def body(channels_last: bool):
        def run():
            net.zero_grad(set_to_none=True)
            z = inp.contiguous(memory_format=torch.channels_last) if channels_last else inp
            h = net.body(z)
            pooled = torch.cat([h.mean(dim=(2, 3)), h.std(dim=(2, 3))], dim=1)
            net.head(torch.cat([pooled, colour], dim=1)).sum().backward()
        return run

    rows = [
        ("3x3 box mean", lambda: F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False),
         lambda: _box_means(x, (3,))),
        ("per-crop std", lambda: x.std(dim=(2, 3)), lambda: _spatial_std(x)),
        ("body forward+backward", body(False), body(True)),
    ]
    print(f"288 crops of 48 px, torch threads {args.threads}, {args.repeats} repeats; ms per batch")
    print(f"{'part':24s} {'replaced':>10s} {'current':>10s} {'ratio':>7s}")
    for name, old, new in rows:
        a, b = _ms(old, args.repeats), _ms(new, args.repeats)
        print(f"{name:24s} {a:10.2f} {b:10.2f} {a / b:7.2f}x")
    print(f"{'input preparation now':24s} {'':>10s} {_ms(lambda: net._inputs(crops), args.repeats):10.2f}")

    batch = crops.reshape(48, 6, 48, 48, 3)
    try:  # a private torch check; absent from some builds
        bf16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):
        bf16 = "unknown"
    print(f"\nwhole network forward+backward, fp32 vs bf16 autocast (bf16 supported: {bf16})")
    for width in (16, 32):
        wnet = DegradationNet(NetConfig(width=width))
        wnet.train()

        def step(bf16: bool, wnet=wnet):
            def run():
                wnet.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    y = wnet(batch)
                y.float().sum().backward()
                return y
            return run
        a, b = _ms(step(False), args.repeats), _ms(step(True), args.repeats)
        print(f"{'width ' + str(width):24s} {a:10.2f} {b:10.2f} {a / b:7.2f}x")


if __name__ == "__main__":
    main()
