"""``dataset.kind = "imagefolder"`` against PIL: JPEG and PNG files written with PIL, a daemon
embedded in this process (``pinring.Loader(embedded=True)``, host backend) and real
``pinring-loader`` processes decoding them with ``transform = "eval"`` and u8 output; each
delivered image is compared with PIL's ``Image.open(f).convert("RGB")`` resized so that its
shorter side is 256 (BILINEAR, as torchvision's ``Resize(256)``) and center-cropped to 224.

Tolerance: mean absolute difference below 3 levels (of 255) per image, and labels exact. What
differs: the JPEG decoder (zune-jpeg in pinring, libjpeg-turbo in PIL: IDCT and chroma
upsampling round differently), and the resampling (pinring resamples the crop box of the
original image in one pass with fast_image_resize's bilinear convolution; PIL resizes the whole
image and then crops; both use the same antialiased bilinear kernel but round their fixed-point
arithmetic differently). PNG files have no decoder difference. Measured here (Pillow 13.0,
7 images of 280x280 to 500x375): 0.18 to 0.22 levels for PNG, 0.30 to 0.39 for JPEG (quality 90);
the tolerance leaves room for other libjpeg-turbo builds. docs/IMAGES.md measures both steps.
"""

import subprocess
import uuid

import pytest

import pinring
from test_consumer import binary

np = pytest.importorskip("numpy")
PIL_Image = pytest.importorskip("PIL.Image")

MAX_MEAN_ABS_DIFF = 3.0
CROP, RESIZE, BATCH = 224, 256, 4


def photo(w, h, seed):
    """Smooth colour gradients plus a little noise, like a photo to a JPEG encoder."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    chans = []
    for c in range(3):
        p = rng.uniform(0, 6.28)
        v = 128 + 90 * np.sin(x / w * (2 + c) + y / h * 3 + p) + 30 * np.cos(x / w * 17 - y / h * (11 + c) + p)
        chans.append(v + rng.integers(-6, 7, size=v.shape))
    return PIL_Image.fromarray(np.clip(np.stack(chans, axis=-1), 0, 255).astype(np.uint8), "RGB")


def pil_eval(path):
    """torchvision Resize(256) + CenterCrop(224) with PIL: the reference."""
    img = PIL_Image.open(path).convert("RGB")
    w, h = img.size
    if w <= h:
        nw, nh = RESIZE, int(RESIZE * h / w)
    else:
        nw, nh = int(RESIZE * w / h), RESIZE
    img = img.resize((nw, nh), PIL_Image.BILINEAR)
    left, top = int(round((nw - CROP) / 2.0)), int(round((nh - CROP) / 2.0))
    return np.asarray(img.crop((left, top, left + CROP, top + CROP)), dtype=np.uint8)


def make_folder(root):
    """root/<class>/<file>, 2 classes, JPEG and PNG; returns (path, label) in ImageFolder order."""
    sizes = [(320, 300), (300, 410), (500, 375), (280, 280), (333, 290), (400, 260), (290, 350)]
    out = []
    for k, (w, h) in enumerate(sizes):
        label = k % 2
        ext = "png" if k % 3 == 2 else "jpg"
        d = root / f"class{label}"
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"img{k:02d}.{ext}"
        img = photo(w, h, k)
        if ext == "jpg":
            img.save(p, quality=90)
        else:
            img.save(p)
        out.append((p, label))
    return sorted(out, key=lambda s: (s[1], s[0].name))


def test_eval_u8_matches_pil_within_tolerance(tmp_path):
    samples = make_folder(tmp_path / "train")
    config = tmp_path / "pinring.toml"
    config.write_text(
        f"""
[ring]
name = "py-img-{uuid.uuid4().hex[:10]}"
slots = 4
[dataset]
kind = "imagefolder"
[dataset.imagefolder]
root = "train"
[dataset.image]
transform = "eval"
crop = {CROP}
resize = {RESIZE}
output = "u8"
[plan]
batch_size = {BATCH}
shuffle = false
epochs = 1
"""
    )
    loader = pinring.Loader(embedded=True, config=str(config), backend="host", as_numpy=True)
    procs = [
        subprocess.Popen(
            [*binary("pinring-loader"), "--ring", loader.ring, "--wait-secs", "30", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    try:
        seen = []
        diffs = []
        for b in loader.batches():
            images = np.from_dlpack(b.fields["images"])
            labels = np.from_dlpack(b.fields["labels"])
            assert images.shape[1:] == (CROP, CROP, 3) and images.dtype == np.uint8
            for n in range(images.shape[0]):
                i = b.batch * BATCH + n  # shuffle = false: the plan's order is the folder's
                path, label = samples[i]
                assert int(labels[n]) == label, f"label of {path}"
                d = np.abs(images[n].astype(np.int16) - pil_eval(path).astype(np.int16)).mean()
                diffs.append((path.name, float(d)))
                assert d < MAX_MEAN_ABS_DIFF, f"{path.name}: mean abs difference {d:.2f} from PIL"
                seen.append(i)
        del b
        assert seen == list(range(len(samples))), seen
    finally:
        loader.close()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    print("mean abs difference from PIL per image:", diffs)


def run_folder(root, decode, train):
    """Every batch of the folder at ``root`` through ``pinring.Loader(loaders=2)`` on the host
    backend, the image table given as data with ``decode``; returns (images, labels) per batch."""
    image = {"crop": 64, "output": "u8", "decode": decode}
    image.update({"transform": "train"} if train else {"transform": "eval", "resize": 72})
    if decode == "gpu":
        image["encoded_bytes"] = "2MiB"
    out = []
    with pinring.Loader(dataset={"kind": "imagefolder", "root": str(root)}, image=image,
                        batch_size=BATCH, shuffle=True, seed=3, epochs=2, loaders=2,
                        backend="host", as_numpy=True, progress=False) as loader:
        for _epoch in range(2):  # a for loop is one epoch, as torch's
            for b in loader:
                out.append((np.array(b["images"]), np.array(b["labels"])))
    return out


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_decode_gpu_on_the_host_backend_is_the_cpu_path_bit_for_bit(tmp_path, train):
    """``image={"decode": "gpu"}``: the loaders write the compressed files and their crops, and
    the host engine decodes them as it copies, with the loaders' own code and crops: every
    batch equals the ``decode = "cpu"`` run's, byte for byte, in both epochs."""
    make_folder(tmp_path / "train")
    cpu = run_folder(tmp_path / "train", "cpu", train)
    gpu = run_folder(tmp_path / "train", "gpu", train)
    assert len(cpu) == len(gpu) == 4, (len(cpu), len(gpu))
    for (ci, cl), (gi, gl) in zip(cpu, gpu):
        assert np.array_equal(cl, gl)
        assert ci.shape == gi.shape and np.array_equal(ci, gi)


def test_encoded_bytes_is_refused_beside_decode_cpu(tmp_path):
    make_folder(tmp_path / "train")
    with pytest.raises(pinring.ConfigError, match="encoded_bytes"):
        pinring.Loader(dataset={"kind": "imagefolder", "root": str(tmp_path / "train")},
                       image={"decode": "cpu", "encoded_bytes": "1MiB"}, batch_size=BATCH,
                       embedded=True, backend="host")


def test_decode_gpu_carries_the_compressed_files_within_encoded_bytes(tmp_path):
    """The gpu run above really carries compressed files: with 1 KiB a sample, a 500x375 JPEG
    does not fit its part, and the run stops with the loader's message naming the sample and
    ``encoded_bytes``."""
    make_folder(tmp_path / "train")
    image = {"transform": "eval", "crop": 64, "resize": 72, "decode": "gpu",
             "encoded_bytes": f"{BATCH}KiB"}
    with pytest.raises(pinring.PinringError, match="encoded_bytes"):
        with pinring.Loader(dataset={"kind": "imagefolder", "root": str(tmp_path / "train")},
                            image=image, batch_size=BATCH, epochs=1, loaders=1, backend="host",
                            as_numpy=True, progress=False, timeout=60) as loader:
            for _ in loader:
                pass


def test_decode_counts_from_the_engine_that_decodes(tmp_path):
    """An embedded loader's daemon decodes (``decode="gpu"`` on the host backend: its engine,
    on the CPU): the summary ``close()`` returns counts every image it decoded, per way, and
    ``decode_counts()`` says this process's copier decoded none."""
    files = make_folder(tmp_path / "train")
    image = {"transform": "eval", "crop": 64, "resize": 72, "decode": "gpu", "encoded_bytes": "2MiB"}
    loader = pinring.Loader(dataset={"kind": "imagefolder", "root": str(tmp_path / "train")},
                            image=image, batch_size=BATCH, epochs=1, loaders=1, backend="host",
                            as_numpy=True, progress=False)
    n = sum(np.array(b["labels"]).shape[0] for b in loader)
    assert loader.decode_counts() is None
    summary = loader.close()
    assert n in (len(files), len(files) - len(files) % BATCH), n
    counts = summary["images_decoded"]
    assert counts["cpu"] == n and counts["failed"] == 0 and counts["gpu"] == 0, counts


def mixed_shard(path):
    """A WebDataset shard of the JPEGs real datasets hold (baseline 4:2:0, 4:4:4 and 4:2:2,
    progressive, grayscale, CMYK, one with an EXIF orientation), a PNG, and two bad files: a PNG
    whose image data is damaged behind intact headers (it fails only where it is decoded) and
    a JPEG cut inside its headers (its loader cannot read its size). Returns the kinds in
    member order."""
    import io
    import tarfile
    kinds = ["420", "444", "422", "progressive", "gray", "cmyk", "exif", "png", "bad-png",
             "cut-jpeg"]
    with tarfile.open(path, "w") as tf:
        for k, kind in enumerate(kinds):
            img = photo(180 + 13 * k, 140 + 7 * k, 40 + k)
            b = io.BytesIO()
            ext = "jpg"
            if kind == "444":
                img.save(b, "JPEG", quality=90, subsampling=0)
            elif kind == "422":
                img.save(b, "JPEG", quality=90, subsampling=1)
            elif kind == "progressive":
                img.save(b, "JPEG", quality=90, progressive=True)
            elif kind == "gray":
                img.convert("L").save(b, "JPEG", quality=90)
            elif kind == "cmyk":
                img.convert("CMYK").save(b, "JPEG", quality=90)
            elif kind == "exif":
                exif = PIL_Image.Exif()
                exif[0x0112] = 6  # rotated 90 degrees: pixels are taken as stored
                img.save(b, "JPEG", quality=90, exif=exif)
            elif kind in ("png", "bad-png"):
                img.save(b, "PNG")
                ext = "png"
            else:
                img.save(b, "JPEG", quality=90)
            data = bytearray(b.getvalue())
            if kind == "bad-png":
                mid = len(data) // 2
                data[mid:mid + 16] = bytes(x ^ 0x5A for x in data[mid:mid + 16])
            elif kind == "cut-jpeg":
                data = data[:40]
            for name, payload in ((f"{k:04d}.{ext}", bytes(data)), (f"{k:04d}.cls", str(k).encode())):
                ti = tarfile.TarInfo(name)
                ti.size = len(payload)
                tf.addfile(ti, io.BytesIO(payload))
    return kinds


def test_a_mixed_real_world_set_decodes_every_good_file_and_substitutes_the_bad(tmp_path):
    """``decode="gpu"`` on a shard of every JPEG kind real datasets hold: each good file is the
    CPU path's sample bit for bit (the host engine decodes with the loaders' code; on a GPU host
    the cuda engine sends progressive and CMYK files to the same CPU code), the two bad files
    have zero images (``on_bad_sample="skip"``): the one whose headers do not read counted by
    its loader, the one that fails at the decoder by the engine, as ``failed``. EXIF
    orientation is not applied (as PIL's ``Image.open`` and torchvision's ``decode_jpeg``
    leave it by default)."""
    kinds = mixed_shard(tmp_path / "mixed.tar")
    runs = {}
    for decode in ("cpu", "gpu"):
        image = {"transform": "eval", "crop": 48, "resize": 56, "decode": decode}
        loader = pinring.Loader(dataset={"kind": "webdataset", "shards": [str(tmp_path / "mixed.tar")],
                                         "on_bad_sample": "skip"},
                                image=image, batch_size=5, shuffle=False, epochs=1, loaders=1,
                                backend="host", as_numpy=True, progress=False)
        images, labels = [], []
        for b in loader:
            images.extend(np.array(b["images"]))
            labels.extend(int(v) for v in np.array(b["labels"]))
        runs[decode] = (images, labels, loader.close())
    (cpu, cpu_labels, cpu_summary), (gpu, gpu_labels, gpu_summary) = runs["cpu"], runs["gpu"]
    assert len(cpu) == len(gpu) == len(kinds)
    for k, kind in enumerate(kinds):
        assert np.array_equal(cpu[k], gpu[k]), kind
        bad = kind in ("bad-png", "cut-jpeg")
        assert (not gpu[k].any()) == bad, kind
        # A loader's substitute is zeros in every field; a sample the decoder fails keeps its
        # other fields (only its image is decoded where it is copied).
        assert cpu_labels[k] == (0 if bad else k), kind
        assert gpu_labels[k] == (0 if kind == "cut-jpeg" else k), kind
    # The CPU path's loader meets both bad files; with decode="gpu" it reads only headers.
    assert cpu_summary["bad_samples_skipped"] == 2, cpu_summary
    assert gpu_summary["bad_samples_skipped"] == 1, gpu_summary
    counts = gpu_summary["images_decoded"]
    assert counts["failed"] == 1 and counts["cpu"] == len(kinds) - 2, counts
