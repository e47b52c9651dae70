"""The ``device=`` argument of ``pinring.Loader`` and ``pinring.torch.DataLoader``: one parser
for both, taking an int, ``"cuda"``, ``"cuda:N"``, ``"cpu"``, ``"host"`` and a ``torch.device``
(looked at without importing torch); anything else is a ``UsageError`` naming the argument and
the forms. On this CPU host the host backend feeds ``"cpu"``, and CUDA asked for where no driver
is raises ``BackendError`` with the fix (``device="cpu"``)."""

import os
import subprocess
import sys
import textwrap
import uuid

import pytest

import pinring

np = pytest.importorskip("numpy")

# 32 synthetic samples in batches of 8: 4 batches an epoch.
SMALL = {"samples": 32, "sample_shape": [4], "dtype": "f32"}
FORMS = '"cuda", "cuda:N", "cpu" (or "host": pinring\'s host backend) or a torch.device'


def no_gpu():
    """Whether this host has no NVIDIA device nodes, so CUDA cannot be usable here."""
    return not os.path.exists("/dev/nvidiactl")


def test_the_forms_parse_alike_without_importing_torch():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # as where torch is not installed
        from pinring import _device
        got = [tuple(_device.parse(d, "x")) for d in (0, 3, "cuda", "cuda:2", "cpu", "host")]
        assert got == [("cuda", 0), ("cuda", 3), ("cuda", None), ("cuda", 2), ("cpu", None),
                       ("cpu", None)], got
        assert _device.parse(None, "x") is None
        print("ok")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cuda:-1", "CUDA", -1, 1.5, True, [0]])
def test_anything_else_names_the_argument_and_the_forms(device):
    for call, make in (
        ("pinring.Loader", lambda: pinring.Loader(dataset=SMALL, device=device, backend="host")),
        ("pinring.Loader", lambda: pinring.Loader(ring="py-none", device=device)),
    ):
        with pytest.raises(pinring.UsageError) as e:
            make()
        text = str(e.value)
        assert text.startswith(f"{call}(device={device!r}): "), text
        assert FORMS in text, text


def one_epoch(**kw):
    with pinring.Loader(dataset=SMALL, batch_size=8, loaders=1, as_numpy=True, timeout=60,
                        **kw) as loader:
        got = [b["images"].shape for b in loader]
        return loader.device, got


@pytest.mark.parametrize("device", ["cpu", "host"])
def test_cpu_and_host_run_the_host_backend(device):
    assert one_epoch(device=device) == ("cpu", [(8, 4)] * 4)


def test_a_torch_device_is_taken_as_it_is():
    torch = pytest.importorskip("torch")
    assert one_epoch(device=torch.device("cpu")) == ("cpu", [(8, 4)] * 4)
    with pytest.raises(pinring.UsageError, match=r"device=device\(type='meta'\)"):
        pinring.Loader(dataset=SMALL, device=torch.device("meta"))


def test_a_device_and_a_backend_that_disagree_are_refused():
    with pytest.raises(pinring.UsageError, match='device="cpu" runs the host backend'):
        pinring.Loader(dataset=SMALL, device="cpu", backend="cuda")
    with pytest.raises(pinring.UsageError, match='backend="host"'):
        pinring.Loader(dataset=SMALL, device="cuda:0", backend="host")


@pytest.mark.skipif(not no_gpu(), reason="for a host without a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_where_there_is_none_is_a_backend_error_with_the_fix(device):
    with pytest.raises(pinring.BackendError) as e:
        pinring.Loader(dataset=SMALL, device=device, loaders=1)
    text = str(e.value)
    assert text.startswith(f"pinring.Loader(device={device!r}): no NVIDIA driver found"), text
    assert 'pass device="cpu"' in text and "--" not in text, text


def test_an_attached_loader_checks_where_the_ring_delivers(tmp_path):
    name = f"py-dev-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "ring.toml"
    config.write_text('[dataset]\nsamples = 32\nsample_shape = [4]\n[plan]\nbatch_size = 8\n')
    daemon = pinring.EmbeddedDaemon(config=str(config), ring=name, backend="host")
    try:
        for device in ("cpu", "host", 0):  # an int is a CUDA ordinal: a host ring serves any
            with pinring.Loader(ring=name, device=device) as loader:
                assert loader.device == "cpu"
        with pytest.raises(pinring.UsageError) as e:
            len(pinring.Loader(ring=name, device="cuda:1"))
        assert f"ring {name!r} delivers to cpu, not cuda:1: pass device='cpu'" in str(e.value)
    finally:
        daemon.stop()


# -- pinring.torch.DataLoader: the same parser ------------------------------------------------


def test_the_dataloader_takes_the_same_forms():
    torch = pytest.importorskip("torch")
    from pinring.torch import DataLoader

    class Tiny(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return torch.full((2,), i)

    with DataLoader(Tiny(), batch_size=4, device="host") as pl:
        assert [b.device for b in pl] == [torch.device("cpu")] * 2
    with pytest.raises(pinring.UsageError) as e:
        DataLoader(Tiny(), device="gpu")
    text = str(e.value)
    assert text.startswith("pinring.torch.DataLoader(device='gpu'): ") and FORMS in text, text


@pytest.mark.skipif(not no_gpu(), reason="for a host without a GPU")
def test_the_dataloader_asked_for_cuda_without_a_gpu_raises_backend_error():
    torch = pytest.importorskip("torch")
    from pinring.torch import DataLoader

    class Tiny(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return torch.full((2,), i)

    for device in ("cuda", "cuda:0", torch.device("cuda"), 0):
        with pytest.raises(pinring.BackendError) as e:
            DataLoader(Tiny(), device=device)
        text = str(e.value)
        assert text.startswith(f"pinring.torch.DataLoader(device={device!r}): "), text
        assert "no CUDA device is usable" in text and 'pass device="cpu"' in text, text
        assert "Found no NVIDIA driver" not in text, text
