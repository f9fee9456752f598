#!/usr/bin/python3
"""Baseline of bench/datasets/warm-batches.ts: a Megatron-style local loader.

Gathers the same batches rackfeed serves (micro_batch samples of window tokens) from the local
.bin with numpy, the way megatron-core's IndexedDataset does it: the .bin is a numpy.memmap, each
piece of a sample is numpy.frombuffer(memoryview(mmap), dtype, count, offset), the pieces of a
sample are concatenated and the samples of a batch stacked (what the default collate does).
The (offset, count) pieces of every sample come from rackfeed's own planner (plan file written
by warm-batches.ts), so that both sides gather exactly the same windows; pass 0 is untimed and
writes a sha256 per batch, compared with the HTTP bodies.

usage: numpy_gather.py BIN DTYPE PLAN STEPS MICRO_BATCH WINDOW PASSES OUT.json
"""
import hashlib
import json
import sys
import time

import numpy

bin_path, dtype_s, plan_path, steps, micro_batch, window, passes, out_path = sys.argv[1:9]
steps, micro_batch, window, passes = int(steps), int(micro_batch), int(window), int(passes)
dtype = numpy.dtype(dtype_s)
item = dtype.itemsize

# plan: float64 stream of [n, off_0, count_0, ..., off_{n-1}, count_{n-1}] per sample
raw = numpy.fromfile(plan_path, dtype="<f8")
plan = []
k = 0
for _ in range(steps * micro_batch):
    n = int(raw[k])
    pieces = raw[k + 1:k + 1 + 2 * n].astype(numpy.int64).reshape(n, 2).tolist()
    plan.append(pieces)
    k += 1 + 2 * n
assert k == len(raw), "plan file longer than steps x micro_batch samples"

mmap = numpy.memmap(bin_path, mode="r", order="C")
buf = memoryview(mmap)


def get_sample(pieces):
    parts = [numpy.frombuffer(buf, dtype=dtype, count=c, offset=o) for o, c in pieces]
    return parts[0].copy() if len(parts) == 1 else numpy.concatenate(parts)


def get_batch(step):
    first = step * micro_batch
    batch = numpy.stack([get_sample(plan[first + j]) for j in range(micro_batch)])
    assert batch.shape == (micro_batch, window)
    return batch


# pass 0: warms the page cache, hashes every batch (untimed)
hashes = [hashlib.sha256(get_batch(s).tobytes()).hexdigest() for s in range(steps)]

lat = []
t_all = 0.0
for _ in range(passes):
    t0 = time.perf_counter()
    for s in range(steps):
        a = time.perf_counter()
        b = get_batch(s)
        lat.append(time.perf_counter() - a)
    t_all += time.perf_counter() - t0

with open(out_path, "w") as f:
    json.dump({"hashes": hashes, "latencies": lat, "seconds": t_all, "batches": steps * passes, "numpy": numpy.version.version}, f)
