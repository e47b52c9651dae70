import gc

import pytest

from pinring import _native


def host_field(array):
    """A pinring field over a copy of `array` in Rust memory, and its owner's probe."""
    import numpy as np

    names = {
        np.dtype("uint8"): "u8",
        np.dtype("int32"): "i32",
        np.dtype("int64"): "i64",
        np.dtype("float16"): "f16",
        np.dtype("float32"): "f32",
        np.dtype("float64"): "f64",
    }
    array = np.array(array, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
    return _native._test_host_field(array.tobytes(), names[array.dtype], list(array.shape))


def collect():
    """Frees what is unreachable now, so drop counts are exact."""
    for _ in range(3):
        gc.collect()


@pytest.fixture
def np():
    return pytest.importorskip("numpy")
