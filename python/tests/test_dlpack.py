"""pinring.Field's DLPack export, on host memory owned by Rust (a Vec whose drops are counted)."""

import ctypes

import pytest

import pinring
from conftest import collect, host_field
from pinring import _native

numpy = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

DTYPES = ["uint8", "int32", "int64", "float16", "float32", "float64"]


def capsule_name_is(capsule, name):
    is_valid = ctypes.pythonapi.PyCapsule_IsValid
    is_valid.restype = ctypes.c_int
    is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return is_valid(capsule, name) == 1


def sample(dtype, shape=(3, 4)):
    n = 1
    for d in shape:
        n *= d
    return (numpy.arange(n) * 3 - 5).astype(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES)
def test_numpy_sees_the_values(dtype):
    expected = sample(dtype)
    field, _ = host_field(expected)
    got = numpy.from_dlpack(field)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    numpy.testing.assert_array_equal(got, expected)
    numpy.testing.assert_array_equal(field.numpy(), expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_sees_the_values(dtype):
    expected = sample(dtype)
    field, _ = host_field(expected)
    got = torch.from_dlpack(field)
    assert got.device.type == "cpu"
    assert tuple(got.shape) == expected.shape
    assert got.dtype == torch.from_numpy(expected).dtype
    assert torch.equal(got, torch.from_numpy(expected))


def test_bf16_reaches_torch():
    values = torch.tensor([[1.5, -2.0, 3.25], [0.0, 256.0, -0.5]], dtype=torch.bfloat16)
    raw = values.view(torch.int16).numpy().tobytes()
    field, _ = _native._test_host_field(raw, "bf16", [2, 3])
    assert field.dtype == "bf16"
    got = torch.from_dlpack(field)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, values)


def test_properties():
    field, _ = host_field(sample("float32", (2, 3, 5)))
    assert isinstance(field, pinring.Field)
    assert field.shape == (2, 3, 5)
    assert field.dtype == "f32"
    assert field.device == "cpu"
    assert field.nbytes == 2 * 3 * 5 * 4
    assert field.readonly is False
    assert field.__dlpack_device__() == (1, 0)
    assert repr(field) == "Field(shape=(2, 3, 5), dtype='f32', device='cpu')"


def test_scalar_and_empty_fields():
    scalar, _ = host_field(numpy.array(7, dtype="int64"))
    assert scalar.shape == ()
    assert numpy.from_dlpack(scalar)[()] == 7
    empty, _ = host_field(numpy.zeros((0, 4), dtype="float32"))
    assert numpy.from_dlpack(empty).shape == (0, 4)
    assert torch.from_dlpack(empty).shape == (0, 4)


def test_no_copy_numpy_and_torch_share_the_memory():
    field, _ = host_field(sample("int32"))
    array = numpy.from_dlpack(field)
    tensor = torch.from_dlpack(field)
    array[1, 2] = 12345
    assert tensor[1, 2].item() == 12345
    assert array.ctypes.data == tensor.data_ptr()


def test_owner_lives_until_the_last_numpy_array_dies():
    field, probe = host_field(sample("float64"))
    a = numpy.from_dlpack(field)
    b = field.numpy()[1:]  # a view of an array made from the field
    del field
    collect()
    assert probe.drops == 0
    del a
    collect()
    assert probe.drops == 0
    assert b.sum() == sample("float64")[1:].sum()  # the memory is still there
    del b
    collect()
    assert probe.drops == 1


def test_a_forked_child_freeing_its_copy_of_a_tensor_leaves_the_owner_to_the_parent():
    """A child forked while an array lives frees its copy without dropping the owner (the
    parent's memory and threads); the parent's array keeps it until the parent frees it. The
    module caches its process id, so this fails if a fork did not make the child read its own."""
    import os

    field, probe = host_field(sample("int64"))
    array = numpy.from_dlpack(field)
    del field
    collect()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            del array  # the child's copy of the last reference
            collect()
            os.write(w, str(probe.drops).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    child_saw = os.read(r, 16)
    os.close(r)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_saw == b"0", "the child dropped the parent's owner"
    assert probe.drops == 0
    assert array.sum() == sample("int64").sum()
    del array
    collect()
    assert probe.drops == 1


def test_owner_lives_until_the_last_torch_tensor_dies():
    field, probe = host_field(sample("float32"))
    t = torch.from_dlpack(field)
    u = t[1:].view(-1)
    del field, t
    collect()
    assert probe.drops == 0
    assert torch.equal(u, torch.from_numpy(sample("float32")[1:].reshape(-1)))
    del u
    collect()
    assert probe.drops == 1


def test_owner_outlives_numpy_and_torch_together():
    field, probe = host_field(sample("int64"))
    array = numpy.from_dlpack(field)
    tensor = torch.from_dlpack(field)
    del field, array
    collect()
    assert probe.drops == 0
    del tensor
    collect()
    assert probe.drops == 1


def test_owner_dropped_with_the_field_when_nothing_was_exported():
    field, probe = host_field(sample("uint8"))
    del field
    collect()
    assert probe.drops == 1


def test_unconsumed_capsule_keeps_the_owner_and_frees_it():
    field, probe = host_field(sample("uint8"))
    capsule = field.__dlpack__()
    del field
    collect()
    assert probe.drops == 0
    del capsule
    collect()
    assert probe.drops == 1


@pytest.mark.parametrize("max_version", [None, (0, 8), (1, 0), (1, 3), (2, 0)])
def test_capsule_flavour_follows_max_version(max_version):
    field, probe = host_field(sample("uint8"))
    capsule = field.__dlpack__(max_version=max_version)
    versioned = max_version is not None and max_version[0] >= 1
    if versioned:
        assert capsule_name_is(capsule, b"dltensor_versioned")
    else:
        assert capsule_name_is(capsule, b"dltensor")
    del field, capsule
    collect()
    assert probe.drops == 1


def test_a_capsule_is_consumed_once():
    field, probe = host_field(sample("int32"))
    capsule = field.__dlpack__()
    tensor = torch.from_dlpack(capsule)
    assert capsule_name_is(capsule, b"used_dltensor")
    with pytest.raises(Exception, match="(?i)consumed|used|invalid"):
        torch.from_dlpack(capsule)
    del field, capsule
    collect()
    assert probe.drops == 0  # the tensor still holds it
    assert tensor.sum().item() == int(sample("int32").sum())
    del tensor
    collect()
    assert probe.drops == 1


class OneCapsule:
    """An exporter that hands out the same capsule every time, to consume one capsule twice."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_numpy_refuses_a_consumed_capsule(max_version):
    field, probe = host_field(sample("float32"))
    exporter = OneCapsule(field.__dlpack__(max_version=max_version))
    array = numpy.from_dlpack(exporter)
    with pytest.raises(Exception, match="(?i)name|consumed|used"):
        numpy.from_dlpack(exporter)
    del field, exporter
    collect()
    assert probe.drops == 0
    del array
    collect()
    assert probe.drops == 1


def test_each_export_is_a_new_capsule():
    field, probe = host_field(sample("uint8"))
    arrays = [numpy.from_dlpack(field) for _ in range(5)]
    del field
    collect()
    assert probe.drops == 0
    del arrays
    collect()
    assert probe.drops == 1


def test_stream_hook_sees_the_consumers_stream():
    field, probe = host_field(sample("uint8"))
    numpy.from_dlpack(field)
    torch.from_dlpack(field)
    field.__dlpack__(stream=None)
    field.__dlpack__(stream=7)
    field.__dlpack__(7)
    field.__dlpack__(stream=-1)  # no synchronisation asked for: the hook is not called
    streams = probe.streams
    assert streams[-3:] == [None, 7, 7]
    assert all(s is None for s in streams[:-3])


def test_stream_hook_failure_is_a_buffer_error_and_exports_nothing():
    field, probe = host_field(sample("uint8"))
    probe.fail_next_prepare("the upload failed")
    with pytest.raises(BufferError, match="the upload failed"):
        field.__dlpack__(stream=3)
    assert numpy.from_dlpack(field).shape == (3, 4)  # the next export works
    del field
    collect()
    assert probe.drops == 1


def test_bad_streams_are_refused():
    field, _ = host_field(sample("uint8"))
    with pytest.raises(BufferError):
        field.__dlpack__(stream=-2)
    with pytest.raises(TypeError):
        field.__dlpack__(stream="default")


def test_readonly_reaches_numpy_through_versioned_capsules():
    values = sample("float32")
    field, _ = _native._test_host_field(values.tobytes(), "f32", list(values.shape), readonly=True)
    assert field.readonly is True
    array = numpy.from_dlpack(field)  # NumPy asks for DLPack 1.x, which carries the flag
    assert not array.flags.writeable
    with pytest.raises(ValueError):
        array[0, 0] = 1
    numpy.testing.assert_array_equal(array, values)


def test_no_copy_and_no_other_device():
    field, _ = host_field(sample("uint8"))
    with pytest.raises(BufferError, match="copy"):
        field.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="device"):
        field.__dlpack__(dl_device=(2, 0))
    assert capsule_name_is(field.__dlpack__(copy=False, dl_device=(1, 0)), b"dltensor")


def test_shape_and_data_length_must_agree():
    with pytest.raises(ValueError):
        _native._test_host_field(b"\0" * 10, "f32", [3])
    with pytest.raises(ValueError, match="unknown dtype"):
        _native._test_host_field(b"\0" * 4, "float32", [1])
