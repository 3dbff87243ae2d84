"""Input sets: package photographs with Caffe preprocessing, arrays, and their errors."""

import numpy as np
import pytest
from PIL import Image

from qconsist.errors import ConfigError, InputError, ShapeMismatchError
from qconsist.inputs import Preprocess, open_input_set
from qconsist.inputs.inputset import InputSpec
from qconsist.inputs.preprocess import ChannelOrder

CAFFE = Preprocess(resize=(256, 256), crop=(224, 224), channel_order=ChannelOrder.BGR, mean=(104.0, 117.0, 123.0))


def test_package_photos_caffe_preprocessing_matches_manual_numpy():
    photos = open_input_set("package:photos", CAFFE, input_name="data")
    assert len(photos) >= 20
    assert photos.names[:2] == ["astronaut.png", "chelsea.png"]
    sample = photos.sample(0)["data"]
    assert sample.shape == (1, 3, 224, 224) and sample.dtype == np.float32
    # independent computation with PIL + numpy
    import skimage

    from pathlib import Path

    image = Image.open(Path(skimage.__file__).parent / "data" / "astronaut.png").convert("RGB")
    rgb = np.asarray(image.resize((256, 256), Image.Resampling.BILINEAR), dtype=np.float32)[16:240, 16:240]
    expected = (rgb[..., ::-1] - np.array([104, 117, 123], np.float32)).transpose(2, 0, 1)
    np.testing.assert_array_equal(sample[0], expected)


def test_grey_photo_becomes_three_channels():
    photos = open_input_set("package:photos", CAFFE, input_name="data")
    index = photos.names.index("camera.png")
    sample = photos.sample(index)["data"][0]
    np.testing.assert_array_equal(sample[0] + 104, sample[1] + 117)


def test_digest_depends_on_every_byte(tmp_path):
    arr = np.random.default_rng(0).normal(size=(3, 1, 4)).astype(np.float32)
    np.save(tmp_path / "a.npy", arr)
    arr2 = arr.copy()
    arr2[2, 0, 3] = np.nextafter(arr2[2, 0, 3], np.float32(9))
    np.save(tmp_path / "b.npy", arr2)
    a = open_input_set(tmp_path / "a.npy", input_name="x")
    b = open_input_set(tmp_path / "b.npy", input_name="x")
    assert len(a) == 3 and a.sample(1)["x"].shape == (1, 1, 4)
    assert a.digest() == open_input_set(tmp_path / "a.npy", input_name="x").digest()
    assert a.digest() != b.digest()
    assert a.subset(0, 2).digest() == b.subset(0, 2).digest()


def test_npz_multiple_inputs_and_count_mismatch(tmp_path):
    np.savez(tmp_path / "ok.npz", a=np.zeros((2, 3), np.float32), b=np.ones((2, 5), np.float32))
    s = open_input_set(tmp_path / "ok.npz")
    assert sorted(s.sample(1)) == ["a", "b"] and s.sample(1)["b"].shape == (1, 5)
    np.savez(tmp_path / "bad.npz", a=np.zeros((2, 3)), b=np.ones((3, 5)))
    with pytest.raises(InputError, match=r"arrays differ in sample count"):
        open_input_set(tmp_path / "bad.npz")


def test_errors(tmp_path):
    with pytest.raises(InputError, match=r"input set .*missing does not exist"):
        open_input_set(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match=r"holds no images"):
        open_input_set(empty)
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    folder = open_input_set(tmp_path / "imgs", CAFFE)
    with pytest.raises(InputError, match=r"cannot read image .*broken\.jpg"):
        folder.sample(0)
    with pytest.raises(InputError, match=r"must declare \[preprocess\]"):
        open_input_set("package:photos")
    with pytest.raises(InputError, match=r"unknown bundled input set 'package:cats'"):
        open_input_set("package:cats", CAFFE)
    (tmp_path / "x.npy").write_bytes(b"garbage")
    with pytest.raises(InputError, match=r"cannot read array file"):
        open_input_set(tmp_path / "x.npy")


def test_shape_check_names_input_and_shapes(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((2, 3, 10, 10), np.float32))
    s = open_input_set(tmp_path / "a.npy", input_name="data")
    with pytest.raises(ShapeMismatchError, match=r"input 'data' has shape \[1, 3, 10, 10\], the model wants \[1, 3, 224, 224\]"):
        s.checked([InputSpec("data", np.dtype(np.float32), (1, 3, 224, 224))])
    ok = s.checked([InputSpec("data", np.dtype(np.float32), ("batch", 3, 10, 10))])
    assert ok.sample(1)["data"].shape == (1, 3, 10, 10)


def test_preprocess_validation():
    with pytest.raises(ConfigError, match=r"unknown key\(s\) croop"):
        Preprocess.from_dict({"croop": [1, 2]})
    with pytest.raises(ConfigError, match=r"preprocess.channel_order: invalid value 'XYZ'"):
        Preprocess.from_dict({"channel_order": "XYZ"})
    with pytest.raises(ConfigError, match=r"must be \[height, width\]"):
        Preprocess.from_dict({"resize": [0, 3]})
    p = Preprocess.from_dict({"resize": [8, 8], "channel_order": "bgr", "mean": [1, 2, 3]})
    assert p.channel_order is ChannelOrder.BGR and p.to_json()["mean"] == [1.0, 2.0, 3.0]


def test_augmented_photos_are_seeded_made_when_read_and_named_by_number():

    preprocess = Preprocess(resize=(64, 64), crop=(48, 48), mean=(104.0, 117.0, 123.0))
    a = open_input_set("package:photos:augmented:50000:3", preprocess, "data")
    b = open_input_set("package:photos:augmented:50000:3", preprocess, "data")
    other = open_input_set("package:photos:augmented:50000:4", preprocess, "data")
    assert len(a) == 50000 and a.names[49999] == "049999" and "names" not in a.describe()  # no list that grows
    assert a.sample(12345)["data"].shape == (1, 3, 48, 48)
    assert a.sample(12345)["data"].tobytes() == b.sample(12345)["data"].tobytes()
    assert any(a.sample(i)["data"].tobytes() != other.sample(i)["data"].tobytes() for i in range(4))
    assert a.subset(10, 3).digest() == b.subset(10, 3).digest()
    with pytest.raises(ConfigError, match=r"write package:photos:augmented:COUNT\[:SEED\] with COUNT >= 1"):
        open_input_set("package:photos:augmented:many", preprocess, "data")


def test_package_photos_without_the_photos_extra(monkeypatch):
    """A lean install (no qconsist[photos]): one line that says which extra brings them."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "skimage" else real(name, *a))
    with pytest.raises(InputError, match=r"^package:photos needs the 'skimage' package: pip install 'qconsist\[photos\]'$"):
        open_input_set("package:photos", CAFFE, input_name="data")


def test_a_class_trees_paths_are_made_when_asked_and_the_same_files(tmp_path):
    """A listing keeps its files' paths as strings (``FilePaths``): each is a ``Path`` when asked for, in the
    listing's order, sliced by ``subset`` and sent to workers as they are; the samples are the same."""
    import pickle
    from pathlib import Path

    from qconsist.inputs.folder import FilePaths, scan_folder

    tree = tmp_path / "tree"

    for label, names in (("b", ["z.png", "a.png"]), ("a", ["m.png", "sub/c.png"])):
        for name in names:
            (tree / label / name).parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((4, 4, 3), len(name), np.uint8)).save(tree / label / name)
    found = scan_folder(tree)
    expected = [tree / "a" / "m.png", tree / "a" / "sub" / "c.png", tree / "b" / "a.png", tree / "b" / "z.png"]
    assert isinstance(found.files, FilePaths) and found.files == expected and list(found.files) == expected
    assert found.names == ["a/m.png", "a/sub/c.png", "b/a.png", "b/z.png"]
    assert found.files[2] == expected[2] and type(found.files[2]) is type(Path())
    assert found.files[1:3] == expected[1:3] and isinstance(found.files[1:3], FilePaths)
    assert pickle.loads(pickle.dumps(found.files)) == expected
    inputs = open_input_set(tree, Preprocess.from_dict({"resize": [4, 4]}), "x").subset(1, 2)
    assert list(inputs.paths) == expected[1:3] and inputs.names == ["a/sub/c.png", "b/a.png"]
    assert inputs._load.file(0) == expected[1]  # the worker's file of sample 0: the subset's first


def test_a_folder_lists_images_by_their_last_extension_in_any_case_and_in_name_order(tmp_path):
    """The listing's rule (``folder._is_image``: the name's last extension, any case; hidden names skipped), as
    ``os.path.splitext`` decided it before the listing was made faster for 50,000-file class trees."""
    import os

    from qconsist.inputs.folder import IMAGE_SUFFIXES, scan_folder

    root = tmp_path / "set"
    names = ["b.JPG", "a.jpeg", "c.png.txt", "d..png", "e.tar.gif", "noext", "f.Tiff", ".hidden.png", "g.jpg.",
             "h.webp", "notes.md", "jpg"]
    for kind in ("cat", "dog"):
        (root / kind).mkdir(parents=True)
        for name in names:
            Image.new("RGB", (4, 4)).save(root / kind / name, format="PNG")
    (root / "cat" / "x.png").mkdir()  # a folder named like an image: not one
    expected = sorted(n for n in names if not n.startswith(".") and os.path.splitext(n)[1].lower() in IMAGE_SUFFIXES)
    assert expected == ["a.jpeg", "b.JPG", "d..png", "e.tar.gif", "f.Tiff", "h.webp"]
    found = scan_folder(root)
    assert found.names == [f"{kind}/{n}" for kind in ("cat", "dog") for n in expected]
    assert list(found.files) == [root / name for name in found.names]
    assert found.labels.by_name == {name: int(name.startswith("dog")) for name in found.names}
