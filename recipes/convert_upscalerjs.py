"""Convert a super-resolution model of npm's @upscalerjs packages (MIT, Kevin Scott; idealo's
image-super-resolution architectures, trained on DIV2K) into the safetensors files the replicators
load:

    npm pack @upscalerjs/esrgan-slim@1.0.0            # the package as the registry ships it
    python recipes/convert_upscalerjs.py upscalerjs-esrgan-slim-1.0.0.tgz \\
        collapseguard/weights/replicator_sr_rdn_x2.safetensors
    npm pack @upscalerjs/esrgan-legacy@1.0.0
    python recipes/convert_upscalerjs.py upscalerjs-esrgan-legacy-1.0.0.tgz \\
        ~/.cache/collapseguard/replicator_sr_rrdn_gan_x4.safetensors --model models/gans --input-range 0-1 --half

The first is the x2 RDN (222 k parameters) of the ``super_resolution`` family, the second the x4
GAN-trained RRDN (4.18 M parameters, ``MultiplyBeta`` residual scaling and a ``PixelShuffle4x``
layer, inputs in 0-1) of the ``rrdn_gan`` family, which is not in the package: it is looked for
at ``~/.cache/collapseguard/`` or ``$COLLAPSEGUARD_RRDN_GAN_WEIGHTS``. The tarball is read in memory
(nothing is extracted). Quantized weights (uint8/uint16 affine, float16) are
expanded; TF.js kernels (H, W, in, out) become torch's (out, in, H, W), stored as float16 with
``--half``; the layer graph (``modelTopology``) is stored in the file's metadata as JSON, with the
package name, version, licence, input range and the SHA-256 of the tarball, its keys in sorted
order, so that one tarball converts to the same bytes on every run. ``--check SAMPLE``
runs the converted network on the package's ``assets/fixture.png`` and prints how far its output is
from the package's own result image (``assets/samples/2x/result.png``, ``assets/samples/gans/result.png``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import tarfile
from pathlib import Path

import numpy as np

#: the residual scale of idealo's RRDN (upscalerjs' ``MultiplyBeta`` layer hard-codes it)
BETA = 0.2


def convert(tgz: Path, out: Path, model_dir: str = "models/x2", input_range: str = "0-255",
            half: bool = False) -> dict:
    from safetensors.numpy import save

    data = tgz.read_bytes()
    with tarfile.open(tgz, "r:gz") as tf:
        def read(name: str) -> bytes:
            member = tf.getmember(name)
            if not member.isfile():
                raise SystemExit(f"{tgz}: {name} is not a file")
            return tf.extractfile(member).read()
        pkg = json.loads(read("package/package.json"))
        folder = "package/" + model_dir.strip("/")
        model = json.loads(read(f"{folder}/model.json"))
        manifest = model["weightsManifest"]
        blob = b"".join(read(f"{folder}/{p}") for group in manifest for p in group["paths"])
    tensors, offset = {}, 0
    for group in manifest:
        for w in group["weights"]:
            if w["dtype"] != "float32":
                raise SystemExit(f"unexpected dtype {w['dtype']} for {w['name']}")
            n = int(np.prod(w["shape"]))
            quant = w.get("quantization")
            if quant is None:
                arr = np.frombuffer(blob, dtype="<f4", count=n, offset=offset)
                offset += 4 * n
            elif quant["dtype"] in ("uint8", "uint16"):  # affine: min + scale * q
                q = np.frombuffer(blob, dtype="<u1" if quant["dtype"] == "uint8" else "<u2", count=n, offset=offset)
                offset += q.itemsize * n
                arr = quant["min"] + quant["scale"] * q.astype(np.float64)
            elif quant["dtype"] == "float16":
                arr = np.frombuffer(blob, dtype="<f2", count=n, offset=offset)
                offset += 2 * n
            else:
                raise SystemExit(f"unexpected quantization {quant['dtype']} for {w['name']}")
            arr = arr.reshape(w["shape"])
            if arr.ndim == 4:  # HWIO -> OIHW
                arr = arr.transpose(3, 2, 0, 1)
            tensors[w["name"]] = np.ascontiguousarray(arr, dtype=np.float16 if half else np.float32)
    if offset != len(blob):
        raise SystemExit(f"weights use {offset} of {len(blob)} bytes")
    layers = [{"class": layer["class_name"], "name": layer["name"],
               "inputs": [i[0] for i in layer["inbound_nodes"][0]] if layer["inbound_nodes"] else [],
               "config": {k: layer["config"][k] for k in ("filters", "kernel_size", "padding", "activation",
                                                          "size", "interpolation", "axis", "scale")
                          if k in layer["config"]}}
              for layer in model["modelTopology"]["model_config"]["config"]["layers"]]
    for layer in layers:
        if layer["class"] == "MultiplyBeta":
            layer["config"]["beta"] = BETA
    meta = {"layers": json.dumps(layers), "source": f"npm {pkg['name']}@{pkg['version']} ({model_dir}/model.json)",
            "license": pkg.get("license", ""), "author": str(pkg.get("author", "")),
            "tarball_sha256": hashlib.sha256(data).hexdigest(), "input_range": input_range}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(_sorted_metadata(save(tensors, metadata=meta)))
    return {"tensors": len(tensors), "parameters": int(sum(t.size for t in tensors.values())), **meta}


def _sorted_metadata(raw: bytes) -> bytes:
    """safetensors bytes with the keys of their metadata in sorted order. The writer keeps the
    metadata in a hash map, whose order changes from one call to the next, so the same tensors and
    metadata would give other bytes each time; the tensors' entries and data stay as written."""
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the writer pads it
    return struct.pack("<Q", len(text)) + text + raw[8 + n:]


def check(tgz: Path, weights: Path, sample: str) -> str:
    """How far the converted network's output on the package's ``assets/fixture.png`` is from the
    package's own result image ``sample``: mean and 99th-percentile absolute difference in grey levels."""
    import io

    import torch
    from PIL import Image

    from collapseguard.training_data_tools.replicators.super_resolution import (
        load_network,
    )

    with tarfile.open(tgz, "r:gz") as tf:
        fixture, result = (np.asarray(Image.open(io.BytesIO(tf.extractfile(f"package/{m}").read())).convert("RGB"))
                           for m in ("assets/fixture.png", sample))
    x = torch.from_numpy(np.ascontiguousarray(fixture.transpose(2, 0, 1), dtype=np.float32))[None]
    with torch.inference_mode():
        y = load_network(weights)(x)[0].numpy().transpose(1, 2, 0)
    out = np.clip(np.rint(y), 0, 255)
    if out.shape != result.shape:
        return f"output {out.shape} differs in shape from {sample} {result.shape}"
    d = np.abs(out - result)
    return (f"{fixture.shape[1]}x{fixture.shape[0]} -> {out.shape[1]}x{out.shape[0]}: mean |difference| to "
            f"{sample} {d.mean():.3f} levels, 99th percentile {np.percentile(d, 99):.0f}, max {d.max():.0f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tgz", type=Path, help="the package tarball (npm pack)")
    ap.add_argument("out", type=Path, help="the safetensors file to write")
    ap.add_argument("--model", default="models/x2", help="the model's folder in the package")
    ap.add_argument("--input-range", choices=["0-255", "0-1"], default="0-255",
                    help="the pixel range the network takes and returns (upscalerjs' inputRange)")
    ap.add_argument("--half", action="store_true", help="store the kernels as float16")
    ap.add_argument("--check", metavar="SAMPLE", default=None,
                    help="a result image in the package (e.g. assets/samples/gans/result.png): run the "
                         "converted network on its assets/fixture.png and print how far its output is")
    args = ap.parse_args()
    info = convert(args.tgz, args.out, args.model, args.input_range, args.half)
    print(f"{info['tensors']} tensors, {info['parameters']} parameters from {info['source']} "
          f"(licence {info['license']}, tarball sha256 {info['tarball_sha256'][:16]})")
    if args.check:
        print(check(args.tgz, args.out, args.check))
