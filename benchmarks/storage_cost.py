"""What recording an image's storage costs next to decoding it (the same bytes, one run).

    python benchmarks/storage_cost.py

``score``, ``filter`` and ``audit`` decode every image with ``images.decode_with_storage``, which
reads the storage (format, JPEG chroma subsampling) from the same opening of the bytes as the
decode. Prints, on a 1024x768 noise image stored as JPEG q90 (4:2:0) and as PNG, the time of a
plain ``decode_image``, of ``decode_with_storage`` and of the header-only ``image_storage``, and
the ratio of the first two.
"""

import timeit

import numpy as np

from collapseguard.images import (
    decode_image,
    decode_with_storage,
    encode_jpeg,
    encode_png,
    image_storage,
)


def best(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7)) / number


img = (np.random.default_rng(0).random((768, 1024, 3)) * 255).astype(np.uint8)
for name, data in (("jpeg q90", encode_jpeg(img, 90)), ("png", encode_png(img))):
    plain = best(lambda d=data: decode_image(d), 5)
    both = best(lambda d=data: decode_with_storage(d), 5)
    header = best(lambda d=data: image_storage(d), 200)
    print(f"{name}: decode_image {plain * 1e3:.2f} ms, decode_with_storage {both * 1e3:.2f} ms "
          f"({decode_with_storage(data)[1]}), ratio {both / plain:.3f}; image_storage alone "
          f"{header * 1e6:.0f} us")
