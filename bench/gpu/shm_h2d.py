"""Token batches from rackfeed's shared-memory ring straight into GPU memory, timed per batch.

A trainer on the server's host maps the ring (README, "Shared-memory fast path") and copies each
batch from its slot to the GPU, then releases the slot: no CPU copy on the trainer's side. With
`registered`, the whole ring mapping is page-locked once with cudaHostRegister, so the copy engine
reads the slot directly (DMA); with `pageable`, CUDA stages each batch through its own pinned
buffer, as it does for any ordinary memory. Beside them, measured in the same run on the same
GPU: the host-to-device bandwidth of a pinned buffer of the batch's size (the physical limit of
any host-to-GPU feed) and of a pageable one.

Usage: shm_h2d.py SOCKET DATASET MICRO_BATCH STEPS PASSES registered|pageable [--hash]
Prints one JSON line: {"mode", "batches", "seconds", "bytes", "gbps", "ring_setup", "first_wait",
"t_wait_p50", "t_wait_p99", "t_h2d_p50", "t_h2d_p99", "pinned_gbps", "pageable_gbps",
"register_flags", "device"}. An untimed consumer reads steps 0..STEPS×PASSES-1 first; the
timed one reads them again, as a trainer iterates (seconds: from its ring mapped and
registered to its last batch landed on the GPU; ring_setup: `open` sent -> ring mapped and
registered; t_wait: how long the trainer waited for each slot, first_wait the first; t_h2d:
copy issued -> copy finished). With --hash, "hashes" also lists the sha256 of every timed batch as
read back from the GPU (a check of the bytes, which slows the run: test/shm/gpu-landing.test.ts
runs it so).
Needs python3 with torch (CUDA), numpy and msgpack.
"""

import hashlib
import json
import mmap
import os
import struct
import sys
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "test", "shm", "python"))
from shm_consumer import Channel  # noqa: E402  the README's protocol, written once

warnings.filterwarnings("ignore", message=".*not writable.*")
CUDA_HOST_REGISTER_READ_ONLY = 0x08


def h2d_gbps(src, dst, reps=30):
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return src.numel() * reps / (time.perf_counter() - t) / 1e9


def map_ring(ring, writable):
    fd = os.open(ring["path"], os.O_RDWR if writable else os.O_RDONLY)
    try:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return mmap.mmap(fd, ring["fileBytes"], prot=prot)
    finally:
        os.close(fd)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def main():
    sock_path, dataset = sys.argv[1], sys.argv[2]
    micro_batch, steps, passes = (int(x) for x in sys.argv[3:6])
    mode = sys.argv[6]
    assert mode in ("registered", "pageable"), mode
    check = "--hash" in sys.argv[7:]
    hashes = []
    dev = torch.device("cuda")

    lat_wait, lat_h2d, total_bytes = [], [], 0
    register_flags = None
    # An untimed consumer, then the timed one, over the same steps: the server then holds their
    # plans for each row alike (the first row to read fresh steps would pay planning).
    for p in range(2):
        end_step = steps * passes
        t_open = time.perf_counter()
        ch = Channel(sock_path)  # one consumer per connection
        ch.send({"t": "hello", "version": 2})
        assert ch.receive()["t"] == "welcome"
        ch.send({"t": "open", "dataset": dataset, "rank": 0, "world": 1, "microBatch": micro_batch,
                 "startStep": 0, "endStep": end_step, "slots": 4, "notify": "wait"})
        ring = ch.receive()
        assert ring["t"] == "ring", ring
        end_step = min(end_step, int(ring["endStep"]))  # the server stops at the dataset's last full step
        mem = map_ring(ring, writable=False)
        slots, slot_bytes, data_offset = ring["slots"], int(ring["slotBytes"]), int(ring["dataOffset"])
        host = np.frombuffer(mem, dtype=np.uint8)
        registered = False
        if mode == "registered":
            # Page-lock the mapping once per ring: the copy engine then reads slots directly.
            rc = torch.cuda.cudart().cudaHostRegister(host.ctypes.data, ring["fileBytes"], CUDA_HOST_REGISTER_READ_ONLY)
            register_flags = "read-only"
            if int(rc) != 0:
                # Drivers without read-only registration need a writable mapping (never written here).
                del host
                mem.close()
                mem = map_ring(ring, writable=True)
                host = np.frombuffer(mem, dtype=np.uint8)
                rc = torch.cuda.cudart().cudaHostRegister(host.ctypes.data, ring["fileBytes"], 0)
                register_flags = "default (writable mapping)"
                if int(rc) != 0:
                    raise SystemExit(f"cudaHostRegister failed: {rc}")
            registered = True
        dst = torch.empty(slot_bytes, dtype=torch.uint8, device=dev)
        src = None
        t_start = time.perf_counter()
        ring_setup = t_start - t_open
        step, ended = 0, False
        while step < end_step:
            slot = step % slots
            generation = step + 1
            t0 = time.perf_counter()
            gen, length, hstep = (int(x) for x in struct.unpack_from("<3d", mem, 64 + 64 * slot))
            if gen != generation:
                ch.queue({"t": "wait", "step": step})
                ch.flush()
                m = ch.receive()
                # `end` may come first once every step is published: the step is in the ring then.
                ended = ended or m["t"] == "end"
                assert m["t"] == "end" or (m["t"] == "batch" and m["step"] == step), m
                gen, length, hstep = (int(x) for x in struct.unpack_from("<3d", mem, 64 + 64 * slot))
            assert gen == generation and hstep == step, (gen, hstep, generation, step)
            t1 = time.perf_counter()
            at = data_offset + slot * slot_bytes
            src = torch.from_numpy(host[at:at + length])
            dst[:length].copy_(src, non_blocking=registered)
            torch.cuda.current_stream().synchronize()  # the slot may be released only once the bytes are on the GPU
            t2 = time.perf_counter()
            ch.queue({"t": "release", "slot": slot, "generation": generation})
            if len(ch.outbox) >= max(1, slots // 4):
                ch.flush()
            if p > 0 and check:
                hashes.append(hashlib.sha256(dst[:length].cpu().numpy().tobytes()).hexdigest())
            if p > 0:
                lat_wait.append(t1 - t0)
                lat_h2d.append(t2 - t1)
                total_bytes += length
            step += 1
        seconds = time.perf_counter() - t_start
        ch.flush()
        while not ended:
            ended = ch.receive()["t"] == "end"
        ch.sock.close()
        if registered:
            rc = torch.cuda.cudart().cudaHostUnregister(host.ctypes.data)  # before the unmap below
            if int(rc) != 0:
                raise SystemExit(f"cudaHostUnregister failed: {rc}")
        src = None
        del host
        mem.close()
    n = slot_bytes
    pinned = torch.empty(n, dtype=torch.uint8).pin_memory()
    pageable = torch.from_numpy(np.ones(n, dtype=np.uint8))
    gpu = torch.empty(n, dtype=torch.uint8, device=dev)
    print(json.dumps({
        "mode": mode, "batches": len(lat_h2d), "seconds": seconds, "bytes": total_bytes,
        "gbps": total_bytes / seconds / 1e9,
        "ring_setup": ring_setup, "first_wait": lat_wait[0],
        "t_wait_p50": pct(lat_wait, 0.5), "t_wait_p99": pct(lat_wait, 0.99),
        "t_h2d_p50": pct(lat_h2d, 0.5), "t_h2d_p99": pct(lat_h2d, 0.99),
        "pinned_gbps": h2d_gbps(pinned, gpu), "pageable_gbps": h2d_gbps(pageable, gpu),
        "register_flags": register_flags, "device": torch.cuda.get_device_name(0),
        **({"hashes": hashes} if check else {}),
    }), flush=True)


if __name__ == "__main__":
    main()
