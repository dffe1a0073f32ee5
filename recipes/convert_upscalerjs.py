"""Convert the x2 model of npm's @upscalerjs/esrgan-slim (MIT, Kevin Scott: an RDN super-resolution
network, idealo's image-super-resolution architecture, 222 k parameters, trained on DIV2K) into the
safetensors file the ``super_resolution`` replicator loads:

    npm pack @upscalerjs/esrgan-slim@1.0.0            # the package as the registry ships it
    python recipes/convert_upscalerjs.py upscalerjs-esrgan-slim-1.0.0.tgz \\
        collapseguard/weights/replicator_sr_rdn_x2.safetensors

The tarball is read in memory (nothing is extracted). TF.js kernels (H, W, in, out) become torch's
(out, in, H, W); the layer graph (``modelTopology``) is stored in the file's metadata as JSON, with
the package name, version, licence and the SHA-256 of the tarball.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tarfile
from pathlib import Path

import numpy as np

MODEL = "package/models/x2/model.json"


def convert(tgz: Path, out: Path) -> dict:
    from safetensors.numpy import save_file

    data = tgz.read_bytes()
    with tarfile.open(tgz, "r:gz") as tf:
        def read(name: str) -> bytes:
            member = tf.getmember(name)
            if not member.isfile():
                raise SystemExit(f"{tgz}: {name} is not a file")
            return tf.extractfile(member).read()
        pkg = json.loads(read("package/package.json"))
        model = json.loads(read(MODEL))
        manifest = model["weightsManifest"]
        blob = b"".join(read(f"package/models/x2/{p}") for group in manifest for p in group["paths"])
    tensors, offset = {}, 0
    for group in manifest:
        for w in group["weights"]:
            if w["dtype"] != "float32":
                raise SystemExit(f"unexpected dtype {w['dtype']} for {w['name']}")
            n = int(np.prod(w["shape"]))
            arr = np.frombuffer(blob, dtype="<f4", count=n, offset=offset).reshape(w["shape"])
            offset += 4 * n
            if arr.ndim == 4:  # HWIO -> OIHW
                arr = arr.transpose(3, 2, 0, 1)
            tensors[w["name"]] = np.ascontiguousarray(arr, dtype=np.float32)
    if offset != len(blob):
        raise SystemExit(f"weights use {offset} of {len(blob)} bytes")
    layers = [{"class": layer["class_name"], "name": layer["name"],
               "inputs": [i[0] for i in layer["inbound_nodes"][0]] if layer["inbound_nodes"] else [],
               "config": {k: layer["config"][k] for k in ("filters", "kernel_size", "padding", "activation",
                                                          "size", "interpolation", "axis")
                          if k in layer["config"]}}
              for layer in model["modelTopology"]["model_config"]["config"]["layers"]]
    meta = {"layers": json.dumps(layers), "source": f"npm {pkg['name']}@{pkg['version']} ({MODEL})",
            "license": pkg.get("license", ""), "author": str(pkg.get("author", "")),
            "tarball_sha256": hashlib.sha256(data).hexdigest(), "input_range": "0-255"}
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out), metadata=meta)
    return {"tensors": len(tensors), "parameters": int(sum(t.size for t in tensors.values())), **meta}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python recipes/convert_upscalerjs.py PACKAGE.tgz OUT.safetensors")
    info = convert(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{info['tensors']} tensors, {info['parameters']} parameters from {info['source']} "
          f"(licence {info['license']}, tarball sha256 {info['tarball_sha256'][:16]})")
