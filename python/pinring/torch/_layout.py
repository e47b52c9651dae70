"""The sample layout of ``pinring.torch.DataLoader``: what ``dataset[0]`` (or the collated
batch) holds, flattened into fixed-shape fields (dtype, shape, path in the sample tree), the
check of every later sample against it, the rebuilding of a batch's tensors into the sample's
tree, and the writes of a sample into a part's fields."""

from __future__ import annotations

import collections.abc
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from pinring import _native

_NUMPY_DTYPES: Dict[np.dtype, str] = {
    np.dtype(np.uint8): "u8",
    np.dtype(np.int8): "i8",
    np.dtype(np.int16): "i16",
    np.dtype(np.uint16): "u16",
    np.dtype(np.int32): "i32",
    np.dtype(np.uint32): "u32",
    np.dtype(np.int64): "i64",
    np.dtype(np.uint64): "u64",
    np.dtype(np.float16): "f16",
    np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64",
    np.dtype(np.bool_): "bool",
}
_TORCH_DTYPES: Dict[Any, str] = {
    torch.uint8: "u8",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float32: "f32",
    torch.float64: "f64",
    torch.bool: "bool",
}
for _name, _code in (("uint16", "u16"), ("uint32", "u32"), ("uint64", "u64")):
    if hasattr(torch, _name):
        _TORCH_DTYPES[getattr(torch, _name)] = _code
_TORCH_OF: Dict[str, Any] = {code: dt for dt, code in _TORCH_DTYPES.items()}
_ITEMSIZE = {"u8": 1, "i8": 1, "bool": 1, "i16": 2, "u16": 2, "f16": 2, "bf16": 2,
             "i32": 4, "u32": 4, "f32": 4, "i64": 8, "u64": 8, "f64": 8}


# -- the sample layout -----------------------------------------------------------------------


class _Leaf(NamedTuple):
    path: str  # where it sits in the sample, for messages: "[0]", "['image']"
    dtype: str  # pinring's dtype name; "str" or "bytes" for those (their UTF-8 bytes, u8)
    # Per sample; a packed leaf's: its share of the part's arena, in elements (ragged_bytes /
    # itemsize; a str's: str_bytes).
    shape: Tuple[int, ...]
    # A packed leaf's dimensions (1 for a str: its bytes); -1: not packed, a fixed shape.
    ndim: int = -1

    @property
    def packed(self) -> bool:
        """Carried packed in an arena beside an index (``_Packer``): a str, or a ragged
        array."""
        return self.ndim >= 0

    @property
    def ragged(self) -> bool:
        """An array whose shape varies from sample to sample."""
        return self.ndim >= 0 and self.dtype not in _ROWS

    @property
    def ring_dtype(self) -> str:
        """The ring field's dtype (its per-sample shape is ``shape``)."""
        return "u8" if self.dtype in _ROWS else self.dtype


# Leaves carried in a row of bytes per sample, as torch's collate batches them: lists.
_ROWS = ("str", "bytes")


def _raw(value: Any) -> bytes:
    """A str's UTF-8 bytes, or the bytes themselves."""
    return value.encode() if isinstance(value, str) else bytes(value)


# A str field's share of its part's arena by default: at least this many bytes a sample, and
# at least four times dataset[0]'s string (rounded up to 64 bytes).
_STR_BYTES_MIN = 256


def default_str_bytes(first: Any) -> int:
    """The bytes a sample of a str (or bytes) field whose value in dataset[0] is ``first``
    has of its part's arena by default."""
    want = max(_STR_BYTES_MIN, 4 * len(_raw(first)))
    return -(-want // 64) * 64


def _describe(value: Any) -> Optional[Tuple[str, Tuple[int, ...]]]:
    """(dtype, shape) of a value that can be a leaf of a batch; None if it cannot."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            return None  # no shape to read (_dtype_note says what to do)
        dt = _TORCH_DTYPES.get(value.dtype)
        return None if dt is None else (dt, tuple(value.shape))
    if isinstance(value, (np.ndarray, np.generic)):
        dt = _NUMPY_DTYPES.get(value.dtype)
        return None if dt is None else (dt, tuple(value.shape))
    # bool before int: bool is an int. As torch's default collate: bool, int64, float64.
    if isinstance(value, bool):
        return "bool", ()
    if isinstance(value, int):
        return "i64", ()
    if isinstance(value, float):
        return "f64", ()
    if isinstance(value, str):
        return "str", ()
    if isinstance(value, (bytes, bytearray)):
        return "bytes", ()
    return None


def _flatten(value: Any, path: str, leaves: List[Any], paths: List[str],
             keys: Optional[List[Tuple[str, ...]]] = None, key: Tuple[str, ...] = ()) -> Any:
    """Appends the leaves of ``value`` in order (and, to ``keys``, each one's keys from the
    sample's top: dict keys, tuple positions, namedtuple fields); returns the tree to rebuild
    it with."""
    if isinstance(value, collections.abc.Mapping):
        names = list(value.keys())
        kids = [_flatten(value[k], f"{path}[{k!r}]", leaves, paths, keys, (*key, str(k)))
                for k in names]
        return ("map", type(value), names, kids)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        kids = [_flatten(v, f"{path}.{f}", leaves, paths, keys, (*key, str(f)))
                for f, v in zip(value._fields, value)]
        return ("namedtuple", type(value), kids)
    if isinstance(value, (tuple, list)):
        kids = [_flatten(v, f"{path}[{i}]", leaves, paths, keys, (*key, str(i)))
                for i, v in enumerate(value)]
        return ("seq", kids)
    leaves.append(value)
    paths.append(path)
    if keys is not None:
        keys.append(key)
    return ("leaf", len(leaves) - 1)


# A ring's field name: 1 to 64 of these (pinring-data's rule for dataset.fields).
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")
_NAME_MAX = 64


def _field_names(keys: List[Tuple[str, ...]]) -> List[str]:
    """The ring's name of each leaf: its keys joined by dots (``image``, ``0``, ``meta.h``;
    ``sample`` for a sample that is one array or number), every character a field name cannot
    hold made ``_``, cut to 64 characters, and made unique with the leaf's number
    (``my_key_3``)."""
    names: List[str] = []
    for i, key in enumerate(keys):
        base = "".join(c if c in _NAME_CHARS else "_" for c in ".".join(key)) or "sample"
        name, n = base[:_NAME_MAX], i
        while name in names:
            tail = f"_{n}"
            name, n = base[:_NAME_MAX - len(tail)] + tail, n + len(keys)
        names.append(name)
    return names


def _rebuild(tree: Any, tensors: Sequence[Any]) -> Any:
    kind = tree[0]
    if kind == "leaf":
        return tensors[tree[1]]
    if kind == "seq":
        # As torch's default collate: a tuple or a list of fields becomes a list.
        return [_rebuild(t, tensors) for t in tree[1]]
    if kind == "namedtuple":
        return tree[1](*(_rebuild(t, tensors) for t in tree[2]))
    _, cls, keys, kids = tree
    items = {k: _rebuild(t, tensors) for k, t in zip(keys, kids)}
    try:
        return cls(items)
    except TypeError:
        return items


class _Layout:
    """Fields of a batch as inferred from one sample (or one collated part of one sample).
    ``ragged``: the leaves whose shape varies from sample to sample (leaf number -> elements of
    the part's arena per sample): each is carried packed (``_Packer``), and the batch holds a
    list of its tensors."""

    def __init__(self, sample: Any, collated: bool, str_bytes: Optional[int] = None,
                 ragged: Optional[Dict[int, int]] = None) -> None:
        ragged = ragged or {}
        leaves: List[Any] = []
        paths: List[str] = []
        keys: List[Tuple[str, ...]] = []
        self.tree = _flatten(sample, "", leaves, paths, keys)
        # Which leaves are Python numbers (batch_size=None yields them as numbers again).
        self.numbers = [
            isinstance(v, (bool, int, float)) and not isinstance(v, np.generic) for v in leaves
        ]
        self.leaves: List[_Leaf] = []
        for i, (value, path) in enumerate(zip(leaves, paths)):
            where = path or "the sample"
            d = _describe(value)
            if d is None:
                raise _native.UsageError(
                    f"{where} of {'collate_fn([dataset[0]])' if collated else 'dataset[0]'} is a "
                    f"{type(value).__name__}{_dtype_note(value)}; pinring batches hold fixed-shape "
                    "numbers, NumPy arrays, tensors, str and bytes: return one of those (or leave "
                    "the field out)"
                )
            dtype, shape = d
            if i in ragged:
                self.leaves.append(_Leaf(path, dtype, (ragged[i],), len(shape)))
                continue
            if dtype in _ROWS:
                if collated:
                    raise _native.UsageError(
                        f"{where} of collate_fn([dataset[0]]) is a {dtype}; a collate_fn runs in "
                        "the workers and must return arrays: return the strings without a "
                        f"collate_fn (they batch as torch's collate batches them, a list of "
                        f"{dtype})"
                    )
                share = str_bytes if str_bytes is not None else default_str_bytes(value)
                self.leaves.append(_Leaf(path, dtype, (share,), 1))
                continue
            if collated:
                if len(shape) == 0 or shape[0] != 1:
                    raise _native.UsageError(
                        f"{where} of collate_fn([dataset[0]]) has shape {list(shape)}; collate_fn "
                        "runs in the workers on the samples of a batch part, and each array it "
                        "returns must have the part's samples as its first dimension (1 here)"
                    )
                shape = shape[1:]
            self.leaves.append(_Leaf(path, dtype, tuple(int(s) for s in shape)))
        if not self.leaves:
            raise _native.UsageError("dataset[0] holds no arrays or numbers: nothing to batch")
        # An array with no elements (shape [0], [3, 0]) has no bytes to carry: it is not a
        # field of the ring, and the trainer makes it (an empty tensor of the batch's rows,
        # torch's collate's shape) beside the batch's other fields. Workers still check it.
        self.empty = [0 in leaf.shape and not leaf.packed for leaf in self.leaves]
        if all(self.empty):
            raise _native.UsageError(
                "every array of dataset[0] is empty (a dimension of 0): nothing to batch; "
                "return at least one array or number with elements"
            )
        # Field names in the ring: the sample's keys and positions (_field_names). Fields are
        # declared largest element first, so every field's chunk in a slot starts aligned to
        # its element size.
        self.names = _field_names(keys)
        # A packed leaf's second field: where each sample lies in the batch's arena, and its
        # shape (i64 [1 + ndim]: element offset, then the dimensions; a str's: its length).
        self.index_names: Dict[int, str] = {}
        for i, leaf in enumerate(self.leaves):
            if leaf.packed:
                base = self.names[i][:_NAME_MAX - 6] + "-index"
                name, n = base, 0
                while name in self.names or name in self.index_names.values():
                    n += 1
                    name = f"{base[:_NAME_MAX - 1 - len(str(n))]}{n}"
                self.index_names[i] = name
        ring: List[Tuple[str, str, Tuple[int, ...]]] = []
        for i, leaf in enumerate(self.leaves):
            if not self.empty[i]:
                ring.append((self.names[i], leaf.ring_dtype, leaf.shape))
            if leaf.packed:
                ring.append((self.index_names[i], "i64", (1 + leaf.ndim,)))
        self.declared = sorted(ring, key=lambda f: -_ITEMSIZE[f[1]])
        self.any_packed = bool(self.index_names)
        self.any_ragged = any(leaf.ragged for leaf in self.leaves)
        # With a ragged field, a collate_fn runs in the training process on the whole batch's
        # samples (the workers carry the samples as they are).
        self.collate_in_trainer = False

    def tensors(self, fields: Dict[str, Any],
                convert: Callable[[List[Any]], List[Any]],
                rows: Optional[int] = None) -> List[Any]:
        """The batch's tensors in leaf order: the ring's ``fields`` (by name) through
        ``convert``, and an empty tensor for each empty leaf, with the batch's rows, on the
        device of the others. ``rows``: only the first rows (a short batch of an iterable
        dataset; the rest were never written)."""
        names = [name for name, e in zip(self.names, self.empty) if not e]
        names += list(self.index_names.values())
        carried = convert([fields[name] for name in names])
        if rows is not None:
            # A short batch: its first rows. An arena stays whole: a part's samples fill its
            # arena from the part's start, not row by row. A full batch is not sliced: a
            # slice is a view whose base, the ring's buffer, a batch copied out of the ring
            # (DataLoader._copy_out) would keep.
            carried = [t if (i < len(self.leaves) and self.leaves[i].packed)
                       or t.shape[0] <= rows else t[:rows]
                       for i, t in zip(self._carried_leaves(), carried)]
        if not any(self.empty) and not self.any_packed:
            return carried
        index_rows = carried[len(carried) - len(self.index_names):]
        rows = (index_rows[0] if index_rows else carried[0]).shape[0]
        device = carried[0].device
        out: List[Any] = []
        it = iter(carried)
        # The index fields come after the others (names above); read back to the host once.
        indices = {i: t.cpu().numpy() for i, t in zip(self.index_names, index_rows)}
        for k, (leaf, e) in enumerate(zip(self.leaves, self.empty)):
            if leaf.ragged:
                out.append(_unpack(next(it), indices[k], leaf, self.names[k]))
            elif leaf.packed:
                # As torch's collate: a list of str or bytes (read back to the host).
                out.append(_unpack_text(next(it), indices[k], leaf, self.names[k]))
            elif e:
                out.append(torch.empty((rows, *leaf.shape), dtype=_TORCH_OF[leaf.dtype],
                                       device=device))
            else:
                out.append(next(it))
        return out

    def _carried_leaves(self) -> List[int]:
        """For each tensor ``tensors`` converts, the leaf it is (an index field: past the
        leaves)."""
        return ([i for i, e in enumerate(self.empty) if not e]
                + [len(self.leaves) + i for i in self.index_names])

    def ring_fields(self) -> List[Tuple[str, str, List[int]]]:
        """The ring's fields as (name, dtype, per-sample shape), in declared order."""
        return [(name, dtype, list(shape)) for name, dtype, shape in self.declared]

    def fields_data(self) -> List[Dict[str, Any]]:
        """The fields as the config's ``dataset.fields`` holds them."""
        return [
            {"name": name, "dtype": dtype, "shape": [int(d) for d in shape]}
            for name, dtype, shape in self.declared
        ]

    def part_views(self, fields: Dict[str, Any], torch_copies: bool) -> List[Any]:
        """The writable views of a part's fields, in leaf order (``_write``'s): None for an
        empty leaf, ``(arena, index)`` for a ragged one."""
        views: List[Any] = []
        for i, (name, empty) in enumerate(zip(self.names, self.empty)):
            if empty:
                views.append(None)
            elif i in self.index_names:
                views.append((np.from_dlpack(fields[name]).reshape(-1)
                              if self.leaves[i].dtype != "bf16"
                              else torch.utils.dlpack.from_dlpack(fields[name]).reshape(-1),
                              np.from_dlpack(fields[self.index_names[i]])))
            else:
                views.append(_view(fields[name], torch_copies))
        return views

    def dataset_table(self, samples: int) -> str:
        """The ``[dataset]`` table of a config whose ring these samples fit (``kind =
        "external"``, ``samples``, ``fields``), as TOML text; read back by pinring's parser
        before it is returned, so it is what a daemon reads."""
        rows = "".join(
            f'    {{ name = "{name}", dtype = "{dtype}", shape = '
            f'[{", ".join(str(int(d)) for d in shape)}] }},\n'
            for name, dtype, shape in self.declared
        )
        text = f'[dataset]\nkind = "external"\nsamples = {int(samples)}\nfields = [\n{rows}]\n'
        read = _native.check_config(text, "pinring.torch.dataset_table")["fields"]
        want = self.ring_fields()
        if [(n, d, list(s)) for n, d, s in read] != want:
            raise _native.InternalError(f"the [dataset] table written reads back as {read}, not "
                                        f"{want}: {text}")
        return text

    def check(self, index: int, value: Any, leaf: _Leaf, n: Optional[int]) -> Optional[bytes]:
        """Raises ``UsageError`` when ``value`` (of sample ``index``, or of a collated part of
        ``n`` samples) does not match the layout; returns a str or bytes leaf's bytes."""
        d = _describe(value)
        if leaf.dtype in _ROWS and d == (leaf.dtype, ()):
            return _raw(value)
        if leaf.ragged:
            if d is not None and d[0] == leaf.dtype and len(d[1]) == leaf.ndim:
                return None
            got = "a " + type(value).__name__ if d is None else f"{d[0]} of shape {list(d[1])}"
            raise _native.UsageError(
                f"{leaf.path or 'the sample'} of sample {index} is {got}, but it is a ragged "
                f"field of {leaf.dtype} with {leaf.ndim} dimensions (any sizes): every sample "
                "must give it that dtype and that many dimensions"
            )
        # A sample's element has the leaf's shape; a collated part's has n rows of it.
        want_shape = leaf.shape if n is None else (n, *leaf.shape)
        if d is not None and d == (leaf.dtype, want_shape):
            return None
        where = leaf.path or "the sample"
        what = f"sample {index}" if n is None else f"collate_fn's output for a part from sample {index}"
        if d is None:
            got = f"a {type(value).__name__}{_dtype_note(value)}"
        else:
            got = f"{d[0]} of shape {list(d[1])}"
        want = (f"a {leaf.dtype}" if leaf.dtype in _ROWS
                else f"{leaf.dtype} of shape {list(want_shape)}")
        ragged = ""
        if n is None and d is not None and d[0] == leaf.dtype and len(d[1]) == len(leaf.shape):
            name = self.names[self.leaves.index(leaf)]
            ragged = (f"; if its shape varies from sample to sample, pass "
                      f"pinring.torch.DataLoader(..., ragged=[{name!r}]) (the samples pinring "
                      "looked at first were alike)")
        raise _native.UsageError(
            f"{where} of {what} is {got}, but dataset[0] made it {want}: every sample must have "
            "the same fields, dtypes and shapes (pad, crop or resize in the dataset, or batch "
            f"them in a collate_fn that returns fixed shapes){ragged}"
        )


def _dtype_note(value: Any) -> str:
    if isinstance(value, torch.Tensor) and value.is_nested:
        return (" (a nested tensor, torch.nested: it has no one shape to carry; return its "
                "components as tensors of their own, a field whose shape varies from sample to "
                "sample is carried as a ragged field, and ragged_as=\"jagged\" makes the batch's "
                "one nested tensor on the device)")
    dt = getattr(value, "dtype", None)
    return "" if dt is None else f" of dtype {dt}"


# The dtypes torch copies (with its intra-op threads, as its own collate does); u16, u32 and
# u64 have few torch ops, so their writes go through NumPy.
_TORCH_COPIES = {"u8", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64", "bool"}


def _view(field: Any, torch_copies: bool = False) -> Any:
    """A writable view of a part's field: NumPy, or torch for bf16 (NumPy has no bf16) and, with
    ``torch_copies``, for every dtype torch copies (``_TORCH_COPIES``).

    The thread of ``num_workers=0`` asks for torch views: its copies of torch samples then run on
    torch's intra-op threads with the GIL released, as torch's ``default_collate`` does in the
    same loop (``torch.stack``), where one NumPy copy per sample runs on one core. A worker
    process has one intra-op thread (``torch.set_num_threads(1)``, as torch's workers), so
    NumPy serves it as well."""
    if field.dtype == "bf16" or (torch_copies and field.dtype in _TORCH_COPIES):
        return torch.utils.dlpack.from_dlpack(field)
    return np.from_dlpack(field)


class _Packer:
    """Where the next sample of a part goes in each ragged field's arena: the part's arena is
    its rows' shares (``rows`` x the leaf's elements per sample), filled from its start, each
    sample's elements after the last; offsets are the batch's (``first`` rows before the
    part), so the trainer needs nothing of the part."""

    def __init__(self, first: int, rows: int) -> None:
        self.first, self.rows = first, rows
        self.used: Dict[int, int] = {}

    def put(self, k: int, leaf: _Leaf, value: Any, arena: Any, index: Any, j: int,
            sample: int, name: str) -> None:
        """Packs ``value`` (leaf ``k`` of sample ``sample``, at row ``j``) into ``arena`` and
        notes its offset and shape in ``index[j]``."""
        flat = (value.detach().reshape(-1) if isinstance(value, torch.Tensor)
                else np.ascontiguousarray(value).reshape(-1))
        at = self.used.get(k, 0)
        room = self.rows * leaf.shape[0]
        count = int(flat.shape[0])
        if at + count > room:
            itemsize = _ITEMSIZE[leaf.ring_dtype]
            setting = "str_bytes" if leaf.dtype in _ROWS else "ragged_bytes"
            what = (f"is a {leaf.dtype} of {count} bytes" + (" (UTF-8)" if leaf.dtype == "str"
                                                               else "")
                    if leaf.dtype in _ROWS else f"holds {count * itemsize} bytes")
            raise _native.UsageError(
                f"{leaf.path or 'the sample'} of sample {sample} {what}, but the "
                f"{self.rows}-sample batch part it is in has {(room - at) * itemsize} of "
                f"field {name!r}'s arena left ({leaf.shape[0] * itemsize} bytes a sample, "
                f"{setting}): pass pinring.torch.DataLoader(..., {setting}=N) with N at "
                f"least {-(-count * itemsize // 64) * 64} (the arena is shared by the part's "
                "samples: a part holds N bytes a sample on average)"
            )
        if isinstance(flat, torch.Tensor) and isinstance(arena, np.ndarray):
            arena[at:at + count] = flat.numpy()
        elif isinstance(arena, torch.Tensor):
            arena[at:at + count] = torch.as_tensor(flat)
        else:
            arena[at:at + count] = flat
        index[j, 0] = self.first * leaf.shape[0] + at
        index[j, 1:] = tuple(value.shape)
        self.used[k] = at + count


def _unpack(arena: Any, index: Any, leaf: _Leaf, name: str) -> List[Any]:
    """A ragged field's tensors in a batch: views of its arena (``[rows, share]``), where its
    index (``[rows, 1 + ndim]``, on the host) says, each checked against the arena first."""
    flat = arena.reshape(-1)
    return [flat[at:at + count].view(shape)
            for at, shape, count in _spans(index, flat.shape[0], leaf, name)]


def _unpack_text(arena: Any, index: Any, leaf: _Leaf, name: str) -> List[Any]:
    """A str (or bytes) field's values in a batch, each length checked against the arena
    (read back to the host once) before a byte is read."""
    raw = arena.reshape(-1).cpu().numpy().tobytes()
    return [raw[at:at + n].decode("utf-8", errors="replace") if leaf.dtype == "str"
            else raw[at:at + n] for at, _, n in _spans(index, len(raw), leaf, name)]


def _spans(index: Any, size: int, leaf: _Leaf,
           name: str) -> Iterator[Tuple[int, List[int], int]]:
    """``(offset, shape, elements)`` of each row of a packed field's index (on the host), each
    checked against the batch's arena of ``size`` elements before it is given to a reader."""
    text = leaf.dtype in _ROWS
    for j, (at, *shape) in enumerate(index.tolist()):
        count = int(np.prod(shape)) if shape else 1
        if at < 0 or min(shape, default=0) < 0 or at + count > size:
            raise _native.VerifyError(
                f"row {j} of {leaf.dtype if text else 'ragged'} field {name!r} says {count} "
                f"{'bytes' if text else 'elements'} at {at}, outside the batch's arena of "
                f"{size}: the ring's bytes were changed under the batch; report it"
            )
        yield at, shape, count


def _on_cpu(value: Any, leaf: _Leaf, index: int) -> None:
    """Raises ``UsageError`` for a tensor of sample ``index`` that is not on the CPU."""
    if isinstance(value, torch.Tensor) and value.device.type != "cpu":
        raise _native.UsageError(
            f"{leaf.path or 'the sample'} of sample {index} is on {value.device}; a "
            "worker's samples must be CPU tensors (the upload is pinring's job)"
        )


def _write(layout: _Layout, value: Any, views: List[Any], j: Optional[int], index: int,
           n: Optional[int], packer: Optional[_Packer] = None) -> None:
    """Writes one sample (at row ``j``) or one collated part (``n`` rows) into the part; a
    ragged leaf's value goes into its arena through ``packer``."""
    leaves: List[Any] = []
    _flatten(value, "", leaves, [])
    if len(leaves) != len(layout.leaves):
        raise _native.UsageError(
            f"sample {index} has {len(leaves)} arrays or numbers, but dataset[0] has "
            f"{len(layout.leaves)}: every sample must have the same structure"
        )
    for k, (value, leaf, view) in enumerate(zip(leaves, layout.leaves, views)):
        raw = layout.check(index, value, leaf, n)
        if leaf.packed:
            if packer is None or j is None:
                raise _native.InternalError("a packed field written without its packer")
            _on_cpu(value, leaf, index)
            packer.put(k, leaf, value if raw is None else np.frombuffer(raw, np.uint8),
                       view[0], view[1], j, index, layout.names[k])
            continue
        if view is None:
            continue  # an empty array: nothing to write (_Layout.empty)
        if isinstance(value, torch.Tensor):
            _on_cpu(value, leaf, index)
            if isinstance(view, torch.Tensor):
                # copy_ releases the GIL, and a large copy runs on torch's intra-op threads.
                (view if j is None else view[j]).copy_(value.detach())
                continue
            src: Any = value.detach().numpy()
        elif isinstance(view, torch.Tensor):
            if view.dtype != torch.bfloat16:
                # NumPy arrays and numbers are NumPy's to write, as in a worker (torch would
                # warn about each read-only array).
                view = view.numpy()
                src = value
            else:
                src = torch.as_tensor(value)
        else:
            src = value
        if j is None:
            view[...] = src
        else:
            view[j] = src


# How many samples the layout is learned from where a ragged field may be (a collate_fn, or
# one sample a batch): dataset[0] and a few more, spread over the dataset (an iterable
# dataset's first ones), to find the arrays whose shape varies. Without, torch's default
# collate could not batch such arrays either, and dataset[0] alone is read.
PROBES = 4
# A ragged field's arena share per sample by default: twice the largest such array among the
# samples looked at, at least this many bytes (rounded up to 64).
_RAGGED_BYTES_MIN = 256


def probe_indices(n: int) -> List[int]:
    """The samples of a map-style dataset of ``n`` the layout is learned from."""
    picks = [0, 1, n - 1, n // 2]
    return list(dict.fromkeys(i for i in picks if 0 <= i < n))[:PROBES]


def layout_of(dataset: Any, collate_fn: Optional[Callable[[List[Any]], Any]],
              unbatched: bool = False, str_bytes: Optional[int] = None,
              ragged: Sequence[str] = (), ragged_bytes: Optional[int] = None,
              probe: bool = False) -> _Layout:
    """The fields of ``dataset``'s batches, from ``dataset[0]`` and, with ``probe``, a few more
    samples (``samples_layout``)."""
    if len(dataset) == 0:
        raise _native.UsageError("the dataset is empty: nothing to load")
    picks = probe_indices(len(dataset)) if probe else [0]
    return samples_layout([dataset[i] for i in picks], collate_fn, unbatched, str_bytes,
                          ragged, ragged_bytes)


def samples_layout(samples: List[Any], collate_fn: Optional[Callable[[List[Any]], Any]],
                   unbatched: bool = False, str_bytes: Optional[int] = None,
                   ragged: Sequence[str] = (), ragged_bytes: Optional[int] = None) -> _Layout:
    """The fields of batches of ``samples`` (the first is ``dataset[0]``): ``sample_layout`` of
    the first, unless an array's shape differs among them (same dtype and dimensions), or its
    field is named in ``ragged``: then that array is a ragged field, every sample carried as it
    is (a ``collate_fn`` runs in the training process, on the whole batch). A ``collate_fn``
    over samples that hold a str or bytes runs there too, with the samples carried as they are:
    what it makes of text (token ids padded to the batch's longest) has no fixed shape, and its
    own output may hold the strings."""
    first = samples[0]
    leaves: List[Any] = []
    keys: List[Tuple[str, ...]] = []
    _flatten(first, "", leaves, [], keys)
    names = _field_names(keys)
    unknown = [r for r in ragged if r not in names]
    if unknown:
        raise _native.UsageError(
            f"pinring.torch.DataLoader(ragged={list(ragged)!r}): {unknown[0]!r} is no field of "
            f"dataset[0]; its fields are {names}"
        )
    # Each sample's leaves described once; a sample of another structure is left out (the
    # worker that meets it says so).
    described = [_describe(v) for v in leaves]
    others = []
    for other in samples[1:]:
        theirs: List[Any] = []
        _flatten(other, "", theirs, [])
        if len(theirs) == len(leaves):
            others.append([_describe(v) for v in theirs])
    found = {i for i, name in enumerate(names) if name in ragged}
    for theirs_d in others:
        for i, (d, o) in enumerate(zip(described, theirs_d)):
            if (d is not None and o is not None and d[0] == o[0] and d[0] not in _ROWS
                    and len(d[1]) == len(o[1]) >= 1 and d[1] != o[1]):
                found.add(i)
    text = any(d is not None and d[0] in _ROWS for d in described)
    if not found and not (text and collate_fn is not None and not unbatched):
        return sample_layout(first, collate_fn, unbatched, str_bytes)
    shares: Dict[int, int] = {}
    for i in sorted(found):
        d = described[i]
        if d is None or d[0] in _ROWS or len(d[1]) == 0:
            raise _native.UsageError(
                f"pinring.torch.DataLoader(ragged=[{names[i]!r}]): {names[i]!r} of dataset[0] "
                "is no array: only arrays (and tensors) can be ragged"
            )
        itemsize = _ITEMSIZE[d[0]]
        if ragged_bytes is None:
            largest = max(_nbytes(ds[i]) for ds in [described, *others])
            budget = max(_RAGGED_BYTES_MIN, 2 * largest)
        else:
            budget = int(ragged_bytes)
        shares[i] = -(-(-(-budget // 64) * 64) // itemsize)
    layout = _Layout(first, collated=False, str_bytes=str_bytes, ragged=shares)
    layout.collate_in_trainer = collate_fn is not None
    return layout


def _nbytes(d: Optional[Tuple[str, Tuple[int, ...]]]) -> int:
    """The bytes of an array so described (``_describe``); 0 for anything else."""
    return 0 if d is None or d[0] in _ROWS else int(np.prod(d[1])) * _ITEMSIZE[d[0]]


def sample_layout(sample: Any, collate_fn: Optional[Callable[[List[Any]], Any]],
                  unbatched: bool = False, str_bytes: Optional[int] = None) -> _Layout:
    """The fields of batches of samples like ``sample`` (``layout_of``'s, from any sample: an
    iterable dataset's first)."""
    if collate_fn is not None and unbatched:
        return _Layout(collate_fn(sample), collated=False, str_bytes=str_bytes)
    if collate_fn is not None:
        return _Layout(collate_fn([sample]), collated=True, str_bytes=str_bytes)
    return _Layout(sample, collated=False, str_bytes=str_bytes)
