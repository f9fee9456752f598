/**
 * @module The SDK's side of the shared-memory fast path (web standards only; the socket and the
 * file mapping come from a `LocalTransport`: `client/node.ts` or `client/deno.ts`). One
 * connection per consumer: `hello`, `open`, then `batch` notices for slots the server filled,
 * each released when the caller moves on.
 */

import {
  type ClientMessage,
  decodeRingHeader,
  decodeSlotHeader,
  encodeFrame,
  encodeTimings,
  FrameDecoder,
  FrameOutbox,
  RING_HEADER_BYTES,
  SHM_PROTOCOL_VERSION,
  SLOT_HEADER_BYTES,
  slotHeaderOffset,
  slotOfStep,
} from "../shm/protocol.ts";
import type { StepTimings } from "../metrics/telemetry-report.ts";

/** How long a polling client re-checks the ring before it sends `wait` and blocks on the socket. */
const POLL_SPIN_MS = 1;

/** How long a socket may take to answer `hello` (the server cuts a silent peer after 5 s). */
const WELCOME_TIMEOUT_MS = 10_000;

/** A connected Unix socket, as the SDK needs it. */
export interface LocalSocket {
  /** The next chunk, or null once the peer closed. */
  read(): Promise<Uint8Array | null>;
  /** Writes `bytes`; false when they could not be (the socket is closed or ended), nothing else. */
  write(bytes: Uint8Array): boolean | void;
  close(): void;
}

/** A ring file opened for reading. */
export interface RingReader {
  /** The whole file mapped read-only, when the runtime can map files (zero-copy batches). */
  readonly mapped: Uint8Array | undefined;
  /** Copies `into.length` bytes at `offset` into `into` (slot headers; whole batches without a mapping). */
  read(offset: number, into: Uint8Array): void;
  /**
   * A view of a slot over an ArrayBuffer of its own (Deno), so that a caller who transfers a
   * batch's buffer detaches that slot's view only, not the ring's headers.
   */
  slot?(offset: number, bytes: number): Uint8Array;
  close(): void;
}

/** What the runtime provides for the shm path. */
export interface LocalTransport {
  connect(socketPath: string): Promise<LocalSocket>;
  openRing(path: string, bytes: number): RingReader;
  /** Yields to the event loop for one turn; a polling client re-checks the ring between turns. */
  nextTurn?(): Promise<void>;
  /**
   * Whether this host sees another process's stores in the order they were made (x86-64), so a
   * slot whose header shows the expected generation holds the whole batch: the client then
   * polls the ring instead of waiting for a notice per batch.
   */
  readonly pollSlots?: boolean;
}

/** A batch in a ring slot: `bytes` is valid until the caller asks for the next batch. */
export interface SlotBatch {
  readonly step: number;
  readonly firstSample: number;
  readonly bytes: Uint8Array;
  readonly dtype: string;
  readonly shape: readonly [number, number];
  readonly cache: string;
}

/** The server's error, as sent in an `error` frame, or a lost connection (status 0). */
export class ShmError extends Error {
  constructor(readonly status: number, readonly code: string, message: string) {
    super(message);
    this.name = "ShmError";
  }
}

/** Reads whole messages off a local socket. */
class MessageReader {
  readonly #socket: LocalSocket;
  readonly #decoder = new FrameDecoder();
  readonly #ready: Record<string, unknown>[] = [];

  constructor(socket: LocalSocket) {
    this.#socket = socket;
  }

  /**
   * The next message. With `timeoutMs` (> 0), a wait on the socket longer than that closes it and
   * throws a retryable `ShmError`, `waitingFor` naming what did not come: a server that stopped
   * (wedged, or its host frozen) keeps the socket open and silent for as long as it is stopped.
   */
  async next(timeoutMs = 0, waitingFor = "a message"): Promise<Record<string, unknown>> {
    while (this.#ready.length === 0) {
      const chunk = timeoutMs > 0 ? await this.#readWithin(timeoutMs, waitingFor) : await this.#socket.read();
      if (chunk === null) throw new ShmError(0, "UNAVAILABLE", "The shared-memory connection closed");
      this.#ready.push(...this.#decoder.push(chunk));
    }
    const m = this.#ready.shift()!;
    if (m.t === "error") throw new ShmError(Number(m.status), String(m.code), String(m.message));
    return m;
  }

  /** One read, armed only while it blocks (a timer per batch would cost a busy consumer). */
  async #readWithin(ms: number, waitingFor: string): Promise<Uint8Array | null> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      return await Promise.race([
        this.#socket.read(),
        new Promise<never>((_, reject) => {
          timer = setTimeout(() => {
            this.#socket.close();
            reject(new ShmError(0, "UNAVAILABLE", `No answer from the shared-memory server in ${ms} ms while waiting for ${waitingFor}`));
          }, ms);
        }),
      ]);
    } finally {
      clearTimeout(timer);
    }
  }
}

/**
 * Says hello and checks which server answers.
 *
 * @returns the server instance id from `welcome`, and whether it takes `timings`
 */
async function greet(socket: LocalSocket, reader: MessageReader, token: string | undefined): Promise<{ instance: string; timings: boolean; stop: boolean }> {
  send(socket, { t: "hello", version: SHM_PROTOCOL_VERSION, ...(token ? { token } : {}) });
  const w = await reader.next();
  if (w.t !== "welcome") throw new ShmError(0, "BAD_RESPONSE", `Expected "welcome", got "${String(w.t)}"`);
  return { instance: String(w.instance), timings: w.timings === true, stop: w.stop === true };
}

function send(socket: LocalSocket, m: ClientMessage): void {
  socket.write(encodeFrame(m));
}

/**
 * One consumer's batches over shared memory, from `startStep` until the server sends `end`.
 * A batch's `bytes` is a view of the mapped slot (or of one reused buffer without a mapping): it
 * stays valid until the next `next()`, which releases the slot to the server.
 *
 * @param instance the server instance `GET /v1/shm` named; another instance behind the socket
 * is refused (a socket path that leads to a different server)
 * @throws {ShmError} status 0 when the connection is lost (retry), else the server's status
 */
export async function* shmBatches(
  transport: LocalTransport,
  socketPath: string,
  instance: string | undefined,
  token: string | undefined,
  c: {
    dataset: string;
    rank: number;
    world: number;
    microBatch: number;
    startStep: number;
    endStep?: number;
    slots: number;
    signal?: AbortSignal;
    /** Longest wait for the ring or a batch's notice, in ms, before the stream fails (retryable); 0: none. */
    timeoutMs?: number;
    /**
     * Called with `live` true once the ring is open, where the server takes timings: `send`
     * writes this consumer's step timings on its socket (false once the connection is gone or
     * aborted); then with `live` false, the same `send`, when the iteration ends or is aborted,
     * still usable during that call (the socket closes after it).
     */
    onTimings?: (send: (steps: readonly StepTimings[]) => boolean, live: boolean) => void;
  },
): AsyncGenerator<SlotBatch, void, undefined> {
  c.signal?.throwIfAborted();
  const socket = await connect(transport, socketPath);
  // Timings written once the connection is closed would be lost without a word (a closed
  // socket drops writes): `send` refuses them from then on, and the client reports over HTTP.
  let live = true;
  let sendTimings: ((steps: readonly StepTimings[]) => boolean) | undefined;
  const endTimings = () => {
    // Told first, while the socket is still open: the client sends what it has queued on it.
    if (sendTimings) c.onTimings?.(sendTimings, false);
    live = false;
    sendTimings = undefined;
  };
  // Aborting closes the socket: a read blocked on it returns (the caller checks its signal).
  const onAbort = () => {
    endTimings();
    socket.close();
  };
  c.signal?.addEventListener("abort", onAbort, { once: true });
  // Aborted while connecting: the listener above never fires for a signal already aborted.
  if (c.signal?.aborted) {
    c.signal.removeEventListener("abort", onAbort);
    socket.close();
    throw c.signal.reason;
  }
  let ring: RingReader | undefined;
  // Sends the release of every slot this consumer holds, the batch last yielded included (set
  // once the ring is open).
  let releaseAll: (() => void) | undefined;
  let failed = false;
  // Set once the server's `end` is reached; a loop left before it (a `break`) says `stop` where
  // the server takes it, so that its ring can serve the next consumer.
  let complete = false;
  let offersStop = false;
  try {
    const reader = new MessageReader(socket);
    const got = await withTimeout(greet(socket, reader, token), socket, WELCOME_TIMEOUT_MS);
    offersStop = got.stop;
    if (instance !== undefined && got.instance !== instance) {
      throw new ShmError(0, "NOT_COLOCATED", `Socket ${socketPath} leads to server ${got.instance}, not ${instance}`);
    }
    const poll = transport.pollSlots === true;
    send(socket, {
      t: "open",
      notify: poll ? "wait" : "all",
      dataset: c.dataset,
      rank: c.rank,
      world: c.world,
      microBatch: c.microBatch,
      startStep: c.startStep,
      ...(c.endStep === undefined ? {} : { endStep: c.endStep }),
      slots: c.slots,
    });
    const timeoutMs = c.timeoutMs ?? 0;
    const r = await reader.next(timeoutMs, "the ring");
    if (r.t !== "ring") throw new ShmError(0, "BAD_RESPONSE", `Expected "ring", got "${String(r.t)}"`);
    try {
      ring = transport.openRing(String(r.path), Number(r.fileBytes));
    } catch (e) {
      // The socket is reachable but not the ring (another /dev/shm, a umask that kept the group
      // out, no mapping left): this consumer reads over HTTP instead.
      throw new ShmError(503, "SHM_UNREACHABLE", `Cannot open the ring ${String(r.path)}: ${(e as Error).message}`);
    }
    const header = new Uint8Array(RING_HEADER_BYTES);
    ring.read(0, header);
    const layout = decodeRingHeader(header);
    if (layout.slots !== r.slots || layout.slotBytes !== r.slotBytes || layout.dataOffset !== r.dataOffset) {
      throw new ShmError(0, "BAD_RESPONSE", `Ring ${String(r.path)} does not match what the server announced`);
    }
    const shape = [Number(r.rows), Number(r.cols)] as const;
    let endStep = Number(r.endStep);
    let ended = false;
    const mapped = ring.mapped ? new DataView(ring.mapped.buffer, ring.mapped.byteOffset, ring.mapped.byteLength) : undefined;
    const headerCopy = new Uint8Array(SLOT_HEADER_BYTES);
    const headerView = new DataView(headerCopy.buffer);
    const readHeader = (slot: number) => {
      if (mapped) return decodeSlotHeader(mapped, slotHeaderOffset(slot));
      ring!.read(slotHeaderOffset(slot), headerCopy);
      return decodeSlotHeader(headerView);
    };
    const copy = ring.mapped ? undefined : new Uint8Array(layout.slotBytes);
    // Each slot's own buffer where the runtime gives one, made again once a caller moved it away.
    const slotViews: (Uint8Array | undefined)[] = [];
    // Releases go out a group at a time (and whenever we are about to block), not one write per batch.
    const group = Math.max(1, layout.slots >> 2);
    const outbox = new FrameOutbox(64 * (group + 1));
    const flush = () => {
      if (outbox.frames > 0) socket.write(outbox.take());
    };
    // The batch last yielded, until the caller asks for the next (it is valid until then).
    let holding = -1;
    let holdingGeneration = 0;
    releaseAll = () => {
      if (holding >= 0) outbox.pushRelease(holding, holdingGeneration);
      holding = -1;
      flush();
    };
    if (got.timings && c.onTimings) {
      sendTimings = (steps) => {
        if (!live) return false;
        flush(); // releases first: the server may be waiting for one
        // A socket closed under us (the server's end, an abort) drops the write: the steps go
        // over HTTP instead of being taken for sent.
        if (socket.write(encodeTimings(steps)) === false) {
          live = false;
          return false;
        }
        return true;
      };
      c.onTimings(sendTimings, true);
    }
    for (let step = c.startStep;; step++) {
      c.signal?.throwIfAborted();
      if (ended && step >= endStep) {
        complete = true;
        return;
      }
      const { slot, generation } = slotOfStep(step, c.startStep, layout.slots);
      let h = poll && step < endStep ? readHeader(slot) : undefined;
      if (h && h.generation !== generation && transport.nextTurn) {
        // The server is most likely assembling this very batch, and a server in the middle of
        // filling slots reads its socket only when the burst ends (milliseconds later): re-poll
        // for a moment, releases sent first, before paying a `wait` round trip.
        flush();
        const until = performance.now() + POLL_SPIN_MS;
        while (h.generation !== generation && performance.now() < until) {
          await transport.nextTurn();
          h = readHeader(slot);
        }
      }
      if (h?.generation !== generation) {
        // Not published yet (or a client that does not poll): block on the socket for its notice.
        if (poll && step < endStep) outbox.push(encodeFrame({ t: "wait", step }));
        flush();
        const m = await reader.next(timeoutMs, `step ${step}`);
        if (m.t === "end") {
          // Every step before `end` was published before it was sent; a polling client may still
          // have some to read (its `wait` crossed the `end`).
          if (step >= Number(m.step)) {
            complete = true;
            return;
          }
          endStep = Number(m.step);
          ended = true;
          h = readHeader(slot);
        } else if (m.t !== "batch") throw new ShmError(0, "BAD_RESPONSE", `Expected "batch" or "end", got "${String(m.t)}"`);
        else if (m.step !== step || m.slot !== slot || m.generation !== generation) {
          throw new ShmError(0, "BAD_RESPONSE", `Batch notice out of order: step ${String(m.step)} in slot ${String(m.slot)}, expected step ${step} in slot ${slot}`);
        } else h = readHeader(slot);
      }
      // The generation is written last: any other generation, or a header that disagrees with
      // the step, is a stale or torn slot and is never read as this batch.
      if (h.generation !== generation || h.step !== step || h.length > layout.slotBytes) {
        throw new ShmError(0, "STALE_SLOT", `Slot ${slot} holds generation ${h.generation} (step ${h.step}), expected ${generation} (step ${step})`);
      }
      const at = layout.dataOffset + slot * layout.slotBytes;
      let bytes: Uint8Array;
      if (ring.mapped && ring.slot) {
        let view = slotViews[slot];
        if (view === undefined || view.buffer.byteLength === 0) slotViews[slot] = view = ring.slot(at, layout.slotBytes);
        bytes = view.subarray(0, h.length);
      } else if (ring.mapped) bytes = ring.mapped.subarray(at, at + h.length);
      else {
        bytes = copy!.subarray(0, h.length);
        ring.read(at, bytes);
      }
      holding = slot;
      holdingGeneration = generation;
      yield { step, firstSample: h.firstSample, bytes, dtype: String(r.dtype), shape, cache: h.cache };
      holding = -1;
      outbox.pushRelease(slot, generation);
      if (outbox.frames >= group) flush();
    }
  } catch (e) {
    // A connection that failed (a server gone) would lose what is written on it now: the
    // timings queued go over HTTP instead.
    live = false;
    failed = true;
    throw e;
  } finally {
    // Timings queued from here on go over HTTP.
    endTimings();
    c.signal?.removeEventListener("abort", onAbort);
    // The loop is over (its end, or the caller's break): every slot goes back, then the ring's
    // pages (a batch view kept past the loop reads zeros), then the connection. The server
    // gives a ring to the next consumer only when its client released every slot and closed the
    // connection itself; an abort closed it already, with the caller's batch held, and a
    // failure leaves the ring as it is: neither is reused.
    if (!failed) {
      releaseAll?.();
      // Left before the end: the server stops filling and takes the slots it filled ahead as
      // released, after the release of the batch last yielded (the ring is unmapped just below).
      if (!complete && offersStop && releaseAll !== undefined) socket.write(encodeFrame({ t: "stop" }));
    }
    ring?.close();
    socket.close();
  }
}

/** Connects, turning a refused or missing socket (a server restarting) into a retryable `ShmError`. */
async function connect(transport: LocalTransport, socketPath: string): Promise<LocalSocket> {
  try {
    return await transport.connect(socketPath);
  } catch (e) {
    throw new ShmError(0, "UNAVAILABLE", `Cannot connect to ${socketPath}: ${(e as Error).message}`);
  }
}

/** Connects and greets only: the server instance behind a socket (used to tell co-location). */
export async function shmInstance(transport: LocalTransport, socketPath: string, token: string | undefined): Promise<string> {
  const socket = await connect(transport, socketPath);
  try {
    return (await withTimeout(greet(socket, new MessageReader(socket), token), socket, WELCOME_TIMEOUT_MS)).instance;
  } finally {
    socket.close();
  }
}

/** `p`, or a ShmError (status 0) after `ms` with the socket closed: a listener that never answers. */
async function withTimeout<T>(p: Promise<T>, socket: LocalSocket, ms: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => {
          socket.close();
          reject(new ShmError(0, "UNAVAILABLE", `No "welcome" within ${ms} ms`));
        }, ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
