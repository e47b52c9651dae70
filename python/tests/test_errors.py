"""pinring's exceptions: one per exit code of the binaries, raised with pinring's messages."""

import os
import subprocess
import sys

import pytest

import pinring
from pinring import _native

EXIT_CODES = {
    "InternalError": (1, "internal"),
    "UsageError": (2, "usage"),
    "ConfigError": (3, "config"),
    "RingError": (4, "ring"),
    "PeerDied": (5, "peer-died"),
    "VerifyError": (6, "verify"),
    "BackendError": (7, "backend"),
    "RefusedError": (8, "refused"),
    "OutputError": (9, "output"),
}


@pytest.mark.parametrize("name", sorted(EXIT_CODES))
def test_hierarchy_and_exit_codes(name):
    cls = getattr(pinring, name)
    assert issubclass(cls, pinring.PinringError)
    assert issubclass(cls, Exception)
    assert (cls.exit_code, cls.exit_name) == EXIT_CODES[name]
    assert cls.__module__ == "pinring"


@pytest.mark.parametrize("name", sorted(EXIT_CODES))
def test_exit_error_picks_the_class(name):
    code = EXIT_CODES[name][0]
    err = _native._error_for_exit(code, "what went wrong")
    assert type(err) is getattr(pinring, name)
    assert str(err) == "what went wrong"
    assert err.exit_code == code


def test_config_error_carries_pinrings_message(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[ring]\nno_such_key = 1\n")
    with pytest.raises(pinring.ConfigError, match="no_such_key") as info:
        _native._test_load_config(str(bad))
    assert info.value.exit_code == 3
    with pytest.raises(pinring.ConfigError, match="cannot read config file"):
        _native._test_load_config(str(tmp_path / "missing.toml"))


def test_good_config_loads(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text("")
    assert "good.toml" in _native._test_load_config(str(good))


def test_ring_error_carries_pinrings_message():
    _native._test_check_ring_name("train-0")
    with pytest.raises(pinring.RingError, match="is invalid") as info:
        _native._test_check_ring_name("no/slashes")
    assert isinstance(info.value, pinring.PinringError)
    assert info.value.exit_code == 4


def test_timeout_is_a_peer_died_with_its_exit_code():
    assert issubclass(pinring.Timeout, pinring.PeerDied)
    assert pinring.Timeout.exit_code == 5 and pinring.Timeout.__module__ == "pinring"


def test_check_config_reports_the_plan_or_pinrings_error():
    info = _native.check_config(
        '[dataset]\nkind = "external"\nsamples = 100\n'
        'fields = [{ name = "x", dtype = "f32", shape = [3] }, { name = "y", dtype = "i64" }]\n'
        "[plan]\nbatch_size = 8\ndrop_last = true\n"
    )
    assert info["batches_per_epoch"] == 12 and info["samples_per_rank"] == 100
    assert info["record_bytes"] == 12 + 8 and info["parts_per_batch"] == 1
    assert info["fields"] == [("x", "f32", [3]), ("y", "i64", [])]
    with pytest.raises(pinring.ConfigError, match="dataset.fields"):
        _native.check_config('[dataset]\nkind = "external"\n', "mine.toml")


def test_check_config_refuses_a_fifo_as_a_token_file_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "tokens.bin"
    os.mkfifo(fifo)
    config = f'[dataset]\nkind = "tokens"\n[dataset.tokens]\nfiles = ["{fifo}"]\nseq_len = 8\n'
    # In a child, so that a blocking open() fails this test on the timeout instead of hanging it.
    code = (
        "import sys, pinring\n"
        "from pinring import _native\n"
        "try:\n"
        "    _native.check_config(sys.argv[1])\n"
        "except pinring.ConfigError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, config], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert str(fifo) in out and "named pipe (FIFO), not a regular file" in out, out


def test_settings_given_as_data_read_as_the_same_file_would():
    text = (
        '[dataset]\nkind = "external"\nsamples = 100\n'
        'fields = [{ name = "x", dtype = "f32", shape = [3] }, { name = "y", dtype = "i64" }]\n'
        "[plan]\nbatch_size = 8\ndrop_last = true\n"
    )
    data = {
        "dataset": {"kind": "external", "samples": 100,
                    "fields": [{"name": "x", "dtype": "f32", "shape": [3]}, {"name": "y", "dtype": "i64"}]},
        "plan": {"batch_size": 8, "drop_last": True},
    }
    from_text, from_data = _native.check_config(text), _native.check_config(data)
    assert from_data == from_text
    assert from_data["settings"][("plan", "batch_size")] == 8
    # The TOML it hands back is the same config again.
    assert _native.check_config(from_data["toml"])["settings"] == from_data["settings"]
    assert _native.config_settings(data) == from_data["settings"]
    # A key the file would refuse is refused as data, by name; so is a seed TOML cannot hold.
    with pytest.raises(pinring.ConfigError, match="batch_sise"):
        _native.check_config({"plan": {"batch_sise": 8}})
    with pytest.raises(pinring.ConfigError, match="plan.seed"):
        _native.check_config({**data, "plan": {"batch_size": 8, "seed": 2**63}})
    with pytest.raises(ValueError, match="TOML text or a dict"):
        _native.check_config(42)
    assert _native.PREFETCH_RANGE == (2, 64)
    # Every ring Python makes hands its batches to a consumer: a prefetch outside that range is
    # refused here, by name, before any daemon starts.
    for prefetch in (1, 65):
        with pytest.raises(pinring.ConfigError, match=f"daemon.prefetch = {prefetch}.*2 to 64"):
            _native.check_config({**data, "daemon": {"prefetch": prefetch}})


def test_an_embedded_daemon_with_a_bad_config_raises_config_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[ring]\nname = "py-badcfg"\n[plan]\nbatch_size = 0\n')
    with pytest.raises(pinring.ConfigError, match="plan.batch_size"):
        pinring.EmbeddedDaemon(config=str(bad), backend="host")
    bad.write_text('[ring]\nname = "py-badcfg"\nno_such_key = 1\n')
    with pytest.raises(pinring.ConfigError, match="no_such_key"):
        pinring.EmbeddedDaemon(config=str(bad), backend="host")


def no_flag_words(text):
    """Asserts that a message a Python caller reads names no command-line flag and no empty
    ring: the caller passed keyword arguments."""
    import re

    # A whole command to run in a shell (how to start the ring's daemon) is not a flag the
    # caller is told it passed: its words are left out of the check.
    said = re.sub(r"pinring-daemon --[^,;)]*", "pinring-daemon ...", text)
    assert not re.search(r"(^|[\s(\"'])--[a-z]", said), f"a command-line flag in: {text}"
    assert 'ring ""' not in text, text


def test_a_config_file_that_cannot_be_read_is_named_in_the_callers_terms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for call, make in (
        ("pinring.Loader", lambda: pinring.Loader(config="nope.toml", loaders=1)),
        ("pinring.Loader", lambda: pinring.Loader(config="nope.toml", embedded=True)),
        ("EmbeddedDaemon", lambda: pinring.EmbeddedDaemon(config="nope.toml")),
        ("Producer", lambda: pinring.Producer("py-nope", config="nope.toml", wait=0.1)),
    ):
        with pytest.raises(pinring.ConfigError) as e:
            make()
        assert str(e.value) == (
            f'{call}(config="nope.toml"): cannot read config file nope.toml: No such file or '
            "directory"
        )
    # A directory, and a FIFO (refused without waiting for a writer).
    os.mkfifo(tmp_path / "fifo.toml")
    for name in (".", "fifo.toml"):
        with pytest.raises(pinring.ConfigError, match="not a regular file") as e:
            pinring.Loader(config=name, loaders=1)
        assert str(e.value).startswith(f'pinring.Loader(config="{name}"): '), str(e.value)


def test_python_callers_read_no_command_line_flags(tmp_path):
    # A missing ring, named as the caller named it.
    with pytest.raises(pinring.RingError) as e:
        pinring.Consumer("py-no-such-ring", wait_for_ring=0.1)
    assert "check the ring name" in str(e.value)
    no_flag_words(str(e.value))
    # The prefetch of a ring that hands its batches to a training process (every ring Python
    # makes), given as data.
    data = {"dataset": {"samples": 64}, "plan": {"batch_size": 8}}
    for prefetch in (65, 300):
        with pytest.raises(pinring.ConfigError, match="2 to 64") as e:
            _native.check_config({**data, "daemon": {"prefetch": prefetch}})
        no_flag_words(str(e.value))
    # An embedded daemon's own options: its keywords.
    path = tmp_path / "four.toml"
    path.write_text("[dataset]\nsamples = 32\n[plan]\nbatch_size = 8\nepochs = 1\n")
    with pytest.raises(pinring.UsageError) as e:
        pinring.EmbeddedDaemon(config=str(path), ring="py-past-end", backend="host", start_seq=9)
    text = str(e.value)
    assert "start_seq=9 is past the end of the plan" in text and '(with ring="py-past-end")' in text
    no_flag_words(text)


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="for a host without a GPU driver")
def test_an_embedded_daemon_asked_for_cuda_without_a_driver_names_backend_host():
    with pytest.raises(pinring.BackendError) as e:
        pinring.EmbeddedDaemon(backend="cuda", ring="py-no-cuda")
    text = str(e.value)
    assert text.startswith('EmbeddedDaemon(backend="cuda", device=0): no NVIDIA driver found'), text
    assert text.endswith(', or pass backend="host"'), text
    no_flag_words(text)


def test_the_dataloaders_settings_are_named_as_its_arguments():
    torch = pytest.importorskip("torch")
    from pinring.torch import DataLoader

    class Tiny(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return torch.full((2,), i)

    for kw, said in ((dict(prefetch=100), "prefetch=100"), (dict(prefetch=1), "prefetch=1"),
                     (dict(epochs=0), "epochs=0")):
        with pytest.raises(pinring.UsageError) as e:
            len(DataLoader(Tiny(), device="cpu", **kw))
        text = str(e.value)
        assert text.startswith(f"pinring.torch.DataLoader({said}): "), text
        no_flag_words(text)
