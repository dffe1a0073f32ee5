"""recipes/set_net_config.py and benchmarks/clean_check.py --mirror: a copy of real cnn weights
with the mirror option scores an image and its mirror image alike, from the same tensors."""

from __future__ import annotations

import torch
from PIL import Image
from safetensors.torch import load_file

from collapseguard.detectors.cnn import CNNDetector
from collapseguard.detectors.cnn_model import DegradationNet, NetConfig, save_net


def test_the_copy_keeps_the_tensors_and_changes_only_what_it_was_asked(tmp_path, recipe_script,
                                                                      benchmark_script, photos, capsys):
    torch.manual_seed(0)
    src = tmp_path / "w.safetensors"
    net = DegradationNet(NetConfig(width=6, crop_size=32, n_crops=4, context=True))
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    save_net(net, src, {"trained_by": "test"})
    dst = tmp_path / "m.safetensors"
    assert recipe_script("set_net_config.py").main([str(src), str(dst), "--mirror", "--n-crops", "3"]) == 0
    a, b = load_file(str(src)), load_file(str(dst))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    before, after = CNNDetector(src, device="cpu"), CNNDetector(dst, device="cpu")
    assert (after.mirror, after.n_crops, after.net.config.context) == (True, 3, True)
    assert not before.mirror and after.version != before.version
    assert after.metadata["trained_by"] == "test" and "mirror" in after.metadata["derived_from"]

    folder = tmp_path / "clean"
    folder.mkdir()
    for i, im in enumerate(photos):
        Image.fromarray(im[:, : im.shape[1] - i]).save(folder / f"{i}.png")  # odd widths too
    capsys.readouterr()
    assert benchmark_script("clean_check.py").main([str(src), str(dst), "--folder", str(folder),
                                                    "--mirror", "--threshold", "0"]) == 0
    out = capsys.readouterr().out
    line = next(r for r in out.splitlines() if r.startswith("mirror |change| max"))
    moved, unmoved = (float(v) for v in line.split()[-2:])
    assert moved > 1e-2 and unmoved < 1e-5
    assert "mirror flips side of 0" in out
