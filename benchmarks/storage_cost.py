"""What reading an image's storage costs next to decoding it (both on the same bytes, one run).

    python benchmarks/storage_cost.py

``images.image_storage`` reads only the header (format, JPEG chroma subsampling); ``score``,
``filter`` and ``audit`` call it once per image beside ``decode_image``. Prints the time of each on a
1024x768 noise image stored as JPEG q90 (4:2:0) and as PNG, and their ratio.
"""

import timeit

import numpy as np

from collapseguard.images import decode_image, encode_jpeg, encode_png, image_storage

img = (np.random.default_rng(0).random((768, 1024, 3)) * 255).astype(np.uint8)
for name, data in (("jpeg q90", encode_jpeg(img, 90)), ("png", encode_png(img))):
    storage = min(timeit.repeat(lambda d=data: image_storage(d), number=200, repeat=5)) / 200
    decode = min(timeit.repeat(lambda d=data: decode_image(d), number=5, repeat=5)) / 5
    print(f"{name}: image_storage {storage * 1e6:.0f} us ({image_storage(data)}), decode_image "
          f"{decode * 1e3:.1f} ms, storage/decode = {storage / decode:.4f}")
