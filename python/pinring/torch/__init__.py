"""``pinring.torch.DataLoader``: keep your ``Dataset``, drop the DataLoader around it.

    from pinring.torch import DataLoader          # instead of torch.utils.data.DataLoader
    loader = DataLoader(dataset, batch_size=256, shuffle=True, num_workers=8)
    for images, labels in loader:                 # CUDA tensors, already on the device
        ...

It takes ``torch.utils.data.DataLoader``'s arguments and yields what the default collate would
yield (lists for tuples, dicts, namedtuples, tensors for numbers and arrays), as tensors on
``device``. Underneath:

- ``num_workers`` worker processes (started with ``spawn``, so CUDA is safe) run the dataset's
  ``__getitem__`` and write each sample straight into a slot of a pinring ring, through NumPy
  views of the slot (``pinring.Producer``): no pickling, no queue, no pin-memory thread.
- A pinring daemon on a thread of this process (embedded mode) uploads the slots into device
  batch buffers; with ``ring=`` the loader attaches to a daemon running as a service instead,
  whose config declares the dataset's fields: ``dataset_table(dataset)`` prints that table.
- The sample layout (fields, dtypes, shapes) is inferred from ``dataset[0]``; every other sample
  must match it, and the error names the index and both shapes when it does not.
- A worker that dies is restarted, and the batch part it held is made again (the ring's leases);
  an exception in ``__getitem__`` reaches the loop with the worker's traceback.

The order of samples is pinring's plan (``docs/PYTHON.md``, "Order"): the same batches as
PyTorch's with ``shuffle=False``; with ``shuffle=True`` every epoch is a permutation of the
dataset, reproducible from ``seed`` and the epoch, but not PyTorch's permutation. Any other
``sampler`` or a ``batch_sampler`` is iterated in the training process, as PyTorch's is, and
gives PyTorch's batches.
"""

import sys

try:
    import torch as _torch  # noqa: F401  (imported here to say what is missing, once)
except ModuleNotFoundError as _missing:
    if _missing.name != "torch":
        raise  # torch is there, but something it imports is not: torch's own error says what
    raise ModuleNotFoundError(
        "pinring.torch needs PyTorch, which this Python cannot import "
        f"({sys.executable}): install it with `pip install torch` (or `pip install "
        "\"pinring[torch]\"`); pinring.Loader and the rest of pinring need no torch",
        name="torch",
    ) from None

from pinring.loader import DEFAULT_EPOCHS
from pinring.torch._dataloader import DataLoader, dataset_table
from pinring.torch._worker import WorkerInfo, get_worker_info

__all__ = ["DataLoader", "WorkerInfo", "get_worker_info", "DEFAULT_EPOCHS", "dataset_table"]
