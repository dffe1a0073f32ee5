"""benchmarks/dedup_scale.py --shards: the images go into shards as stored, one sample each under
a unique key, and the conservation check of a real ``filter`` output passes on it and fails,
naming the member, when one is lost, changed, doubled or on the wrong side."""

from __future__ import annotations

import io
import tarfile

import pytest
from cg_testutil import read_members, run_cli


def _write_tar(path, members):
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def packed(photos, benchmark_script, tmp_path_factory):
    from collapseguard.images import encode_jpeg, encode_png

    mod = benchmark_script("dedup_scale.py")
    root = tmp_path_factory.mktemp("packed")
    images = root / "images"
    images.mkdir()
    files = {}
    stores = [("png", encode_png), ("jpg", lambda a: encode_jpeg(a, 90))] * 4
    for i, (img, (ext, enc)) in enumerate(zip(photos * 2, stores)):
        name = f"{(7919 * (i + 3)) % 10007:07d}.{ext}"
        files[name] = enc(img if i < 4 else img[::2, ::2])
        (images / name).write_bytes(files[name])
    shards = mod.pack_shards(images, root / "shards", 3)
    return mod, root, files, shards


def test_every_image_is_one_sample_with_its_bytes_and_extension(packed):
    mod, root, files, shards = packed
    members = [read_members(s) for s in shards]
    assert [len(m) for m in members] == [3, 3, 2]
    assert dict(m for ms in members for m in ms) == files
    names = [n for ms in members for n, _ in ms]
    assert names == sorted(files)  # name order: the random names shuffle what was made together
    assert mod.pack_shards(root / "images", root / "shards", 3) == shards  # a complete folder is reused


def test_conservation_holds_for_a_real_filter_output_and_names_each_breach(packed, tmp_path):
    import shutil

    mod, _, _, shards = packed
    out = tmp_path / "filtered"
    run_cli(["filter", *shards, "--out", out, "--drop-fraction", "0.4", "-w", "1", "-q"])
    counts = mod.conservation(shards, out)
    assert counts["members"] == 8 and counts["kept"] + counts["rejected"] == 8 and counts["rejected"] >= 2

    kept = sorted((out / "kept").glob("*.tar"))
    rejected = sorted((out / "rejected").glob("*.tar"))
    kept_shard = next(p for p in kept if read_members(p))
    rejected_shard = next(p for p in rejected if read_members(p))
    victim = read_members(kept_shard)[0][0]
    moved = read_members(rejected_shard)[0]

    def breach(edit, expected):
        broken = tmp_path / f"broken_{edit.__name__}"
        shutil.copytree(out, broken)
        edit(broken)
        with pytest.raises(SystemExit, match="conservation FAILED") as exc:
            mod.conservation(shards, broken)
        assert expected in str(exc.value), exc.value

    def changed(o):
        ms = read_members(o / "kept" / kept_shard.name)
        _write_tar(o / "kept" / kept_shard.name, [(n, d + b"\0" if n == victim else d) for n, d in ms])

    def lost(o):
        ms = read_members(o / "kept" / kept_shard.name)
        _write_tar(o / "kept" / kept_shard.name, [(n, d) for n, d in ms if n != victim])

    def doubled(o):
        ms = read_members(o / "kept" / kept_shard.name)
        _write_tar(o / "kept" / kept_shard.name, ms + [(victim, dict(ms)[victim])])

    def misplaced(o):  # a rejected member moved into kept/, bytes intact
        _write_tar(o / "rejected" / rejected_shard.name,
                   [m for m in read_members(o / "rejected" / rejected_shard.name) if m[0] != moved[0]])
        _write_tar(o / "kept" / kept_shard.name, read_members(o / "kept" / kept_shard.name) + [moved])

    breach(changed, f"{victim}: bytes changed in kept/")
    breach(lost, f"{victim}: lost")
    breach(doubled, f"{victim}: 2 copies")
    breach(misplaced, f"{moved[0]}: in kept/, its scores row says rejected")
