"""A CPU stand-in for the few `torch` calls bench/gpu/shm_h2d.py makes, so that its shm protocol
handling runs in CI, where there is no GPU: "device" tensors are numpy arrays, a host-to-device
copy is a numpy copy, and cudaHostRegister/cudaHostUnregister are recorded (and checked: a range is
registered once and unregistered once, never unregistered while unknown), then reported on stderr
at exit as one JSON line {"registered": [[bytes, flags], ...], "unregistered": n}.
Only for test/shm/gpu-landing.test.ts; the real run needs a CUDA GPU and the real torch.
"""

import atexit
import json
import sys

import numpy as _np

__version__ = "stub"
uint8 = _np.uint8
_registered = {}
_log = {"registered": [], "unregistered": 0}


class device:
    def __init__(self, name):
        self.type = name


class _Tensor:
    def __init__(self, a):
        self._a = a

    def __getitem__(self, k):
        return _Tensor(self._a[k])

    def copy_(self, src, non_blocking=False):
        self._a[...] = src._a
        return self

    def numel(self):
        return self._a.size

    def pin_memory(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self._a


def empty(n, dtype=None, device=None):
    return _Tensor(_np.empty(n, dtype=_np.uint8))


def from_numpy(a):
    return _Tensor(a)


class _Cudart:
    def cudaHostRegister(self, ptr, size, flags):
        if ptr in _registered:
            return 712  # cudaErrorHostMemoryAlreadyRegistered
        _registered[ptr] = size
        _log["registered"].append([size, flags])
        return 0

    def cudaHostUnregister(self, ptr):
        if _registered.pop(ptr, None) is None:
            return 713  # cudaErrorHostMemoryNotRegistered
        _log["unregistered"] += 1
        return 0


class _Stream:
    def synchronize(self):
        pass


class cuda:
    @staticmethod
    def cudart():
        return _Cudart()

    @staticmethod
    def synchronize():
        pass

    @staticmethod
    def current_stream():
        return _Stream()

    @staticmethod
    def get_device_name(i):
        return "stub (CPU)"

    @staticmethod
    def is_available():
        return False


atexit.register(lambda: print(json.dumps(_log), file=sys.stderr))
