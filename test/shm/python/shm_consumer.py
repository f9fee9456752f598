"""A shared-memory consumer written from the README's protocol section alone, in Python.

It shows that the written protocol is enough for a client in another language, and is run by
test/shm/python-client.test.ts against a real server. Debian's python3 with python3-msgpack.

Usage: shm_consumer.py SOCKET DATASET RANK WORLD MICRO_BATCH START_STEP END_STEP all|wait [TOKEN] [--hold-ms N] [--timings]
Prints one JSON line per batch ({"step", "slot", "generation", "length", "first_sample",
"cache", "sha256"}), then {"end": step, "waits": n, "timed": k} (n = `wait` messages sent, k =
steps whose t_wait went to the server in `timings` messages: with --timings, where `welcome`
offers them).
"""

import hashlib
import json
import math
import mmap
import socket
import struct
import sys
import time

import msgpack


class Channel:
    """Control frames: a 4-byte big-endian length, then a msgpack map with a string `t`."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = b""
        self.outbox = []

    def send(self, message):
        body = msgpack.packb(message, use_bin_type=True)
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def queue(self, message):
        body = msgpack.packb(message, use_bin_type=True)
        self.outbox.append(struct.pack(">I", len(body)) + body)

    def flush(self):
        # Releases may share one write.
        if self.outbox:
            self.sock.sendall(b"".join(self.outbox))
            self.outbox = []

    def receive(self):
        while True:
            if len(self.buf) >= 4:
                (n,) = struct.unpack_from(">I", self.buf, 0)
                if len(self.buf) >= 4 + n:
                    message = msgpack.unpackb(self.buf[4 : 4 + n], raw=False)
                    self.buf = self.buf[4 + n :]
                    if message.get("t") == "error":
                        raise SystemExit(f"server error {message['status']} {message['code']}: {message['message']}")
                    return message
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise SystemExit("server closed the connection")
            self.buf += chunk


def main():
    argv = [a for a in sys.argv[1:]]
    hold_ms = 0.0
    if "--hold-ms" in argv:
        k = argv.index("--hold-ms")
        hold_ms = float(argv[k + 1])
        del argv[k : k + 2]
    timings = "--timings" in argv
    if timings:
        argv.remove("--timings")
    stop_after = None  # --stop-after N: leave after N batches, saying "stop" (a trainer's break)
    if "--stop-after" in argv:
        k = argv.index("--stop-after")
        stop_after = int(argv[k + 1])
        del argv[k : k + 2]
    sock_path, dataset = argv[0], argv[1]
    rank, world, micro_batch, start, end = (int(x) for x in argv[2:7])
    notify = argv[7]
    token = argv[8] if len(argv) > 8 else None

    ch = Channel(sock_path)
    hello = {"t": "hello", "version": 2}
    if token is not None:
        hello["token"] = token
    ch.send(hello)
    welcome = ch.receive()
    assert welcome["t"] == "welcome" and welcome["version"] == 2, welcome
    timings = timings and welcome.get("timings") is True
    timed_steps, timed_waits, timed = [], [], 0

    def send_timings():
        # Four bins of float64 little-endian values, one per step; NaN = not measured.
        nonlocal timed_steps, timed_waits, timed
        if not timed_steps:
            return
        n = len(timed_steps)
        f64 = lambda values: struct.pack("<%dd" % n, *values)
        ch.queue({"t": "timings", "steps": f64(timed_steps), "t_wait": f64(timed_waits),
                  "t_h2d": f64([math.nan] * n), "t_compute": f64([math.nan] * n)})
        timed += n
        timed_steps, timed_waits = [], []
    ch.send({"t": "open", "dataset": dataset, "rank": rank, "world": world, "microBatch": micro_batch,
             "startStep": start, "endStep": end, "slots": 4, "notify": notify})
    ring = ch.receive()
    assert ring["t"] == "ring", ring

    with open(ring["path"], "rb") as f:
        mem = mmap.mmap(f.fileno(), ring["fileBytes"], prot=mmap.PROT_READ)
    # Ring header: "RFRING01", u32 version, u32 slots, f64 slotBytes, f64 dataOffset.
    magic, version, slots, slot_bytes, data_offset = struct.unpack_from("<8sIIdd", mem, 0)
    assert magic == b"RFRING01" and version == 2, (magic, version)
    assert (slots, slot_bytes, data_offset) == (ring["slots"], ring["slotBytes"], ring["dataOffset"])
    view = memoryview(mem)

    def header(slot):
        # The generation is stored last by the server and read first here (x86-64 keeps loads in order).
        generation, length, step, first_sample, cache = struct.unpack_from("<5d", mem, 64 + 64 * slot)
        return int(generation), int(length), int(step), int(first_sample), int(cache)

    end_step = ring["endStep"]
    ended = False
    stopped = False
    waits = 0
    step = start
    while True:
        if ended and step >= end_step:
            break
        if stop_after is not None and step - start >= stop_after:
            # Every batch read is released (queued above); the slots filled ahead are given
            # back by "stop", where the server takes it (README "Protocol").
            if welcome.get("stop") is True:
                ch.queue({"t": "stop"})
                stopped = True
            break
        slot = (step - start) % slots
        generation = step - start + 1
        waited_from = time.perf_counter()
        h = header(slot) if notify == "wait" and step < end_step else None
        if h is None or h[0] != generation:
            if notify == "wait" and step < end_step:
                ch.queue({"t": "wait", "step": step})
                waits += 1
            ch.flush()  # every release owed goes out before blocking
            m = ch.receive()
            if m["t"] == "end":
                if step >= m["step"]:
                    break
                end_step, ended = m["step"], True  # a wait crossed the end: the step is in the ring
            else:
                assert m["t"] == "batch" and (m["step"], m["slot"], m["generation"]) == (step, slot, generation), m
            h = header(slot)
        gen, length, hstep, first_sample, cache = h
        if gen != generation or hstep != step or length > slot_bytes:
            raise SystemExit(f"stale slot {slot}: generation {gen} step {hstep}, expected {generation} step {step}")
        if timings:
            timed_steps.append(step)
            timed_waits.append(time.perf_counter() - waited_from)
            if len(timed_steps) >= 64:
                send_timings()
        at = int(data_offset) + slot * int(slot_bytes)
        batch = view[at : at + length]  # zero-copy view of the slot
        print(json.dumps({"step": step, "slot": slot, "generation": generation, "length": length,
                          "first_sample": first_sample, "cache": cache,
                          "sha256": hashlib.sha256(batch).hexdigest()}), flush=True)
        batch.release()
        if hold_ms:
            time.sleep(hold_ms / 1000)  # a slow trainer: the server must wait for releases
        ch.queue({"t": "release", "slot": slot, "generation": generation})
        if len(ch.outbox) >= max(1, slots // 4):
            ch.flush()
        step += 1
    send_timings()
    ch.flush()
    print(json.dumps({"end": end_step, "waits": waits, "timed": timed, "stopped": stopped}), flush=True)
    view.release()
    mem.close()
    # Half-close, then read until the server closes (README "Protocol"): a plain close that
    # crosses the server's last frames makes its write fail, and what it had not read yet (the
    # last timings, the releases) is lost with the connection.
    ch.sock.shutdown(socket.SHUT_WR)
    ch.sock.settimeout(5)
    try:
        while ch.sock.recv(65536):
            pass
    except OSError:
        pass
    ch.sock.close()


if __name__ == "__main__":
    main()
