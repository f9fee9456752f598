/**
 * @module The shared-memory protocol, shared by the server and the SDK (web standards only):
 * length-prefixed msgpack frames on a Unix socket, and the layout of a ring file. The README's
 * "Protocol (for clients in any language)" section is the same thing in prose.
 */

// The pack/unpack entry points, not the package's main one: on Node and Deno that one loads
// msgpackr-extract, a native addon, which a Deno without --allow-ffi stops to ask permission for
// on a terminal (and control frames are too small to gain from it).
import { pack } from "msgpackr/pack";
import { unpack } from "msgpackr/unpack";
import { MAX_TIMING_SECONDS, type StepTimings } from "../metrics/telemetry-report.ts";

/**
 * Protocol version sent in `hello` and checked by both ends. 2: slots taken in a fixed order,
 * 64-byte slot headers with the cache state, `notify: "wait"` consumers that poll slot headers.
 */
export const SHM_PROTOCOL_VERSION = 2;

/** Largest ring a client may ask for (`slots` in `open`). */
export const MAX_RING_SLOTS = 64;

/** Largest control frame either end accepts: control messages are tiny, batches travel in the ring. */
export const MAX_FRAME_BYTES = 64 * 1024;

/** First 8 bytes of every ring file. */
export const RING_MAGIC = "RFRING01";

/** Bytes of the ring header (magic, counts, offsets) before the slot headers. */
export const RING_HEADER_BYTES = 64;

/**
 * Bytes of each slot header: generation, length, step, first sample, cache state (5 × float64),
 * padded to a cache line so that the server publishing one slot never shares a line with the
 * header a polling client is reading.
 */
export const SLOT_HEADER_BYTES = 64;

/**
 * A ring holds this many bytes of batches (up to `MAX_RING_SLOTS` slots) when the client asked
 * for fewer and the budget has room: small batches are then released in groups, not one
 * syscall each, and the server runs further ahead of a fast consumer.
 */
export const MIN_RING_BYTES = 4 * 2 ** 20;

/** Cache states of a batch as coded in its slot header. */
export const CACHE_STATES = ["hit", "filling", "miss"] as const;

/** Slot data is page-aligned so a mapped slot is a valid typed array of any dtype. */
export const PAGE_BYTES = 4096;

/** Where a ring's parts lie in its file. */
export interface RingLayout {
  readonly slots: number;
  /** Data bytes per slot (a multiple of `PAGE_BYTES`). */
  readonly slotBytes: number;
  /** Offset of slot 0's data; slot i's data starts at `dataOffset + i * slotBytes`. */
  readonly dataOffset: number;
  /** Size of the whole file. */
  readonly fileBytes: number;
}

/**
 * The layout of a ring of `slots` slots of at least `batchBytes` each.
 *
 * @param slots number of slots
 * @param batchBytes bytes of the largest batch a slot must hold
 */
export function ringLayout(slots: number, batchBytes: number): RingLayout {
  const slotBytes = roundUp(Math.max(1, batchBytes), PAGE_BYTES);
  const dataOffset = roundUp(RING_HEADER_BYTES + slots * SLOT_HEADER_BYTES, PAGE_BYTES);
  return { slots, slotBytes, dataOffset, fileBytes: dataOffset + slots * slotBytes };
}

/** The ring header: magic, version, slot count, slot size, data offset (little-endian). */
export function encodeRingHeader(layout: RingLayout): Uint8Array {
  const out = new Uint8Array(RING_HEADER_BYTES);
  out.set(new TextEncoder().encode(RING_MAGIC), 0);
  const v = new DataView(out.buffer);
  v.setUint32(8, SHM_PROTOCOL_VERSION, true);
  v.setUint32(12, layout.slots, true);
  v.setFloat64(16, layout.slotBytes, true);
  v.setFloat64(24, layout.dataOffset, true);
  return out;
}

/** Reads and checks a ring header. @throws {ShmProtocolError} for a file that is not a ring of this version */
export function decodeRingHeader(bytes: Uint8Array): RingLayout {
  const magic = new TextDecoder().decode(bytes.subarray(0, 8));
  const v = new DataView(bytes.buffer, bytes.byteOffset, RING_HEADER_BYTES);
  if (magic !== RING_MAGIC || v.getUint32(8, true) !== SHM_PROTOCOL_VERSION) {
    throw new ShmProtocolError(`Not a version ${SHM_PROTOCOL_VERSION} rackfeed ring (magic "${magic}")`);
  }
  const slots = v.getUint32(12, true);
  const slotBytes = v.getFloat64(16, true);
  const dataOffset = v.getFloat64(24, true);
  return { slots, slotBytes, dataOffset, fileBytes: dataOffset + slots * slotBytes };
}

/** A slot's header: which fill it holds. Generation 0 means never filled. */
export interface SlotHeader {
  readonly generation: number;
  readonly length: number;
  readonly step: number;
  readonly firstSample: number;
  readonly cache: (typeof CACHE_STATES)[number];
}

/**
 * The slot of a step and the generation it is published with: consumers take slots in a fixed
 * round, so a client can find the next batch in the ring without being told.
 */
export function slotOfStep(step: number, startStep: number, slots: number): { slot: number; generation: number } {
  return { slot: (step - startStep) % slots, generation: step - startStep + 1 };
}

/** Offset of slot `i`'s header in the file. */
export function slotHeaderOffset(i: number): number {
  return RING_HEADER_BYTES + i * SLOT_HEADER_BYTES;
}

/**
 * Writes a slot header at `offset` of a view (the mapped ring itself, or a scratch copy), the
 * generation last: a polling client checks it first, so it must not be seen before the rest.
 */
export function writeSlotHeader(v: DataView, offset: number, h: SlotHeader): void {
  v.setFloat64(offset + 8, h.length, true);
  v.setFloat64(offset + 16, h.step, true);
  v.setFloat64(offset + 24, h.firstSample, true);
  v.setFloat64(offset + 32, CACHE_STATES.indexOf(h.cache), true);
  v.setFloat64(offset, h.generation, true);
}

/**
 * Decodes the slot header at `offset` of a view (the mapped ring itself, or a copy of the header).
 * Reads the generation first: the server writes it last.
 */
export function decodeSlotHeader(v: DataView, offset = 0): SlotHeader {
  const generation = v.getFloat64(offset, true);
  return {
    generation,
    length: v.getFloat64(offset + 8, true),
    step: v.getFloat64(offset + 16, true),
    firstSample: v.getFloat64(offset + 24, true),
    cache: CACHE_STATES[v.getFloat64(offset + 32, true)] ?? "hit",
  };
}

/** Client → server messages. */
export type ClientMessage =
  | { readonly t: "hello"; readonly version: number; readonly token?: string }
  | {
    readonly t: "open";
    readonly dataset: string;
    readonly rank: number;
    readonly world: number;
    readonly microBatch: number;
    readonly startStep: number;
    /** Exclusive; unset: the last full step. */
    readonly endStep?: number;
    /** Ring size = how many batches the server fills ahead (the server may give more, see `MIN_RING_BYTES`). */
    readonly slots?: number;
    /**
     * `all` (default): a `batch` notice for every slot filled. `wait`: the client polls slot
     * headers and is told of a batch only after it said `wait` for it.
     */
    readonly notify?: "all" | "wait";
  }
  | { readonly t: "release"; readonly slot: number; readonly generation: number }
  /**
   * The client reads no more of the ring (a consumer that stops before its end): the server
   * fills no more slots and takes every published slot as released, so the ring may serve the
   * next consumer once the client closes. Only to a server whose `welcome` says `stop: true`.
   */
  | { readonly t: "stop" }
  /** The client found step `step` not yet published and blocks on the socket until it is. */
  | { readonly t: "wait"; readonly step: number }
  /**
   * Steps' timings (seconds), for the `rackfeed_t_*` histograms: what `POST /v1/telemetry`
   * takes, for this connection's consumer, without an HTTP request. Each field is float64
   * little-endian values, one per step, as msgpack bin; NaN = not measured. Only to a server
   * whose `welcome` says `timings: true`.
   */
  | { readonly t: "timings"; readonly steps: Uint8Array; readonly t_wait: Uint8Array; readonly t_h2d: Uint8Array; readonly t_compute: Uint8Array };

/** Server → client messages. */
export type ServerMessage =
  | {
    readonly t: "welcome";
    readonly version: number;
    readonly instance: string;
    /** The server takes `timings` messages (absent: report them over HTTP). */
    readonly timings?: boolean;
    /** The server takes `stop` (absent: a consumer that stops early leaves no ring to reuse). */
    readonly stop?: boolean;
  }
  | {
    readonly t: "ring";
    readonly path: string;
    readonly slots: number;
    readonly slotBytes: number;
    readonly dataOffset: number;
    readonly fileBytes: number;
    readonly dtype: string;
    readonly rows: number;
    readonly cols: number;
    readonly endStep: number;
  }
  | {
    readonly t: "batch";
    readonly slot: number;
    readonly generation: number;
    readonly step: number;
    readonly length: number;
    readonly firstSample: number;
    readonly cache: string;
  }
  | { readonly t: "end"; readonly step: number }
  | { readonly t: "error"; readonly code: string; readonly status: number; readonly message: string };

/** Most steps in one `timings` message: four arrays of float64, 32 KiB, well within a frame. */
export const MAX_TIMINGS_STEPS = 1024;

/**
 * `timings` frames for steps (at most `MAX_TIMINGS_STEPS` each), one buffer for one socket write.
 *
 * @param steps the steps and their timings
 * @returns the frames, concatenated
 */
export function encodeTimings(steps: readonly StepTimings[]): Uint8Array {
  const frames: Uint8Array[] = [];
  for (let from = 0; from < steps.length; from += MAX_TIMINGS_STEPS) {
    const n = Math.min(MAX_TIMINGS_STEPS, steps.length - from);
    const cols = [new Float64Array(n), new Float64Array(n), new Float64Array(n), new Float64Array(n)];
    for (let i = 0; i < n; i++) {
      const s = steps[from + i];
      cols[0][i] = s.step;
      cols[1][i] = s.t_wait;
      cols[2][i] = s.t_h2d ?? NaN;
      cols[3][i] = s.t_compute ?? NaN;
    }
    // Float64Array is little-endian on every platform the SDK runs on; the protocol says so.
    const [steps_, wait, h2d, compute] = cols.map((c) => new Uint8Array(c.buffer));
    frames.push(encodeFrame({ t: "timings", steps: steps_, t_wait: wait, t_h2d: h2d, t_compute: compute }));
  }
  return concatFrames(frames);
}

/** A `timings` message decoded: its own arrays (the frame's bytes may be reused at once). */
export interface DecodedTimings {
  readonly t: "timings";
  readonly count: number;
  readonly tWait: Float64Array;
  readonly tH2d: Float64Array;
  readonly tCompute: Float64Array;
}

/**
 * Checks and copies a `timings` message out of its frame. A timing outside 0–86 400 s is taken
 * as not measured, not refused: an error would end the consumer's batches for a telemetry value
 * (a clock that stepped back), and the message has no answer to carry one. `steps` is not used
 * beyond its length.
 *
 * @throws {ShmProtocolError} naming the field: not bin, lengths that differ or are not whole
 *   float64s, more than `MAX_TIMINGS_STEPS`
 */
export function decodeTimings(m: Record<string, unknown>): DecodedTimings {
  const fields = ["steps", "t_wait", "t_h2d", "t_compute"] as const;
  const bins = fields.map((f) => {
    const v = m[f];
    if (!(v instanceof Uint8Array)) {
      const what = v === null ? "nil" : typeof v === "object" ? `${(v as object).constructor?.name ?? "a map"} (pack the values' bytes as bin, not as an array or an ext)` : typeof v;
      throw new ShmProtocolError(`"timings" field "${f}" must be bin (float64 little-endian values), got ${what}`);
    }
    return v;
  });
  const bytes = bins[0].length;
  if (bytes % 8 !== 0 || bins.some((b) => b.length !== bytes)) {
    throw new ShmProtocolError(`"timings" fields must hold the same number of float64 values, got ${bins.map((b) => b.length).join(", ")} bytes`);
  }
  const count = bytes / 8;
  if (count > MAX_TIMINGS_STEPS) throw new ShmProtocolError(`"timings" holds ${count} steps, at most ${MAX_TIMINGS_STEPS}`);
  const views = bins.map((b) => new DataView(b.buffer, b.byteOffset, b.length));
  const out = [new Float64Array(count), new Float64Array(count), new Float64Array(count)];
  for (let f = 1; f < 4; f++) {
    const col = out[f - 1];
    for (let i = 0; i < count; i++) {
      const v = views[f].getFloat64(i * 8, true);
      col[i] = v >= 0 && v <= MAX_TIMING_SECONDS ? v : NaN;
    }
  }
  return { t: "timings", count, tWait: out[0], tH2d: out[1], tCompute: out[2] };
}

/** A frame: 4-byte big-endian length, then a msgpack map. */
export function encodeFrame(message: ClientMessage | ServerMessage): Uint8Array {
  const body = pack(message) as Uint8Array;
  const out = new Uint8Array(4 + body.length);
  new DataView(out.buffer).setUint32(0, body.length, false);
  out.set(body, 4);
  return out;
}

/** Several frames in one buffer: one socket write for a group of messages. */
export function concatFrames(frames: readonly Uint8Array[]): Uint8Array {
  const out = new Uint8Array(frames.reduce((n, f) => n + f.length, 0));
  let at = 0;
  for (const f of frames) {
    out.set(f, at);
    at += f.length;
  }
  return out;
}

/** The msgpack body of a `release` frame up to the slot's value: map of 3, "t": "release", "slot". */
const RELEASE_HEAD = [0x83, 0xa1, 0x74, 0xa7, ...new TextEncoder().encode("release"), 0xa4, ...new TextEncoder().encode("slot")];
/** Between the slot's value and the generation's: the key "generation". */
const RELEASE_MID = [0xaa, ...new TextEncoder().encode("generation")];
/** A `release` frame's body: the head, a float64 (0xcb + 8 bytes), the key, a float64. */
const RELEASE_BODY_BYTES = RELEASE_HEAD.length + 9 + RELEASE_MID.length + 9;

/**
 * The `release` message of a body laid out as `FrameOutbox.pushRelease` writes it, or undefined
 * for any other body (msgpackr then decodes it): the server reads one per batch, and this is a
 * tenth of msgpackr's time.
 */
function readRelease(buf: Uint8Array, at: number): { t: "release"; slot: number; generation: number } | undefined {
  for (let i = 0; i < RELEASE_HEAD.length; i++) if (buf[at + i] !== RELEASE_HEAD[i]) return undefined;
  const slotAt = at + RELEASE_HEAD.length;
  const midAt = slotAt + 9;
  for (let i = 0; i < RELEASE_MID.length; i++) if (buf[midAt + i] !== RELEASE_MID[i]) return undefined;
  const genAt = midAt + RELEASE_MID.length;
  if (buf[slotAt] !== 0xcb || buf[genAt] !== 0xcb) return undefined;
  const v = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  return { t: "release", slot: v.getFloat64(slotAt + 1, false), generation: v.getFloat64(genAt + 1, false) };
}

/**
 * Frames queued for one socket write. A client sends a `release` per batch: those are written
 * straight into the queue as msgpack by hand (numbers as float64, which msgpack readers decode
 * to the same values), because `encodeFrame` per release (msgpackr's `pack`, then a buffer per
 * frame) was a quarter of the SDK's CPU per shm batch on Node (`bench/shm/client-cost.ts`).
 * Other messages come in through `encodeFrame`.
 */
export class FrameOutbox {
  #buf: Uint8Array;
  #view: DataView;
  #len = 0;
  #frames = 0;

  /** @param bytes the first buffer's size (it grows as needed) */
  constructor(bytes = 1024) {
    this.#buf = new Uint8Array(bytes);
    this.#view = new DataView(this.#buf.buffer);
  }

  /** Frames queued. */
  get frames(): number {
    return this.#frames;
  }

  /** Queues `{t: "release", slot, generation}`. */
  pushRelease(slot: number, generation: number): void {
    this.#reserve(4 + RELEASE_BODY_BYTES);
    const b = this.#buf;
    const v = this.#view;
    let at = this.#len;
    v.setUint32(at, RELEASE_BODY_BYTES, false);
    at += 4;
    for (let i = 0; i < RELEASE_HEAD.length; i++) b[at++] = RELEASE_HEAD[i];
    b[at++] = 0xcb;
    v.setFloat64(at, slot, false);
    at += 8;
    for (let i = 0; i < RELEASE_MID.length; i++) b[at++] = RELEASE_MID[i];
    b[at++] = 0xcb;
    v.setFloat64(at, generation, false);
    this.#len = at + 8;
    this.#frames++;
  }

  /** Queues a frame made by `encodeFrame`. */
  push(frame: Uint8Array): void {
    this.#reserve(frame.length);
    this.#buf.set(frame, this.#len);
    this.#len += frame.length;
    this.#frames++;
  }

  /**
   * The queued frames as one buffer, handed over: the next frames go to a new buffer, since a
   * socket may hold on to this one until the kernel takes it.
   */
  take(): Uint8Array {
    const out = this.#buf.subarray(0, this.#len);
    this.#buf = new Uint8Array(this.#buf.length);
    this.#view = new DataView(this.#buf.buffer);
    this.#len = 0;
    this.#frames = 0;
    return out;
  }

  #reserve(bytes: number): void {
    if (this.#len + bytes <= this.#buf.length) return;
    const bigger = new Uint8Array(Math.max(this.#len + bytes, this.#buf.length * 2));
    bigger.set(this.#buf.subarray(0, this.#len), 0);
    this.#buf = bigger;
    this.#view = new DataView(bigger.buffer);
  }
}

/** A malformed frame, a message out of order, or a ring that does not match what was announced. */
export class ShmProtocolError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ShmProtocolError";
  }
}

/**
 * Cuts a byte stream into messages. Feed it chunks as they arrive; it returns the messages they
 * complete.
 */
export class FrameDecoder {
  /** The unfinished tail: `#held` bytes at the start of `#buf`, which grows by doubling. */
  #buf = new Uint8Array(0);
  #held = 0;

  /**
   * @param chunk the next bytes from the socket
   * @returns the messages completed by this chunk, in order
   * @throws {ShmProtocolError} for a frame over `MAX_FRAME_BYTES` or a body that is not a msgpack map
   */
  push(chunk: Uint8Array): Record<string, unknown>[] {
    // Appended into spare room, not copied whole per chunk: a frame that arrives a byte at a time
    // costs linear, not quadratic, work (any local peer may send one before it says hello).
    let buf = chunk;
    if (this.#held > 0) {
      this.#reserve(this.#held + chunk.length);
      this.#buf.set(chunk, this.#held);
      this.#held += chunk.length;
      buf = this.#buf.subarray(0, this.#held);
    }
    const out: Record<string, unknown>[] = [];
    let at = 0;
    while (buf.length - at >= 4) {
      const len = ((buf[at] << 24) | (buf[at + 1] << 16) | (buf[at + 2] << 8) | buf[at + 3]) >>> 0;
      if (len > MAX_FRAME_BYTES) throw new ShmProtocolError(`Control frame of ${len} bytes exceeds ${MAX_FRAME_BYTES}`);
      if (buf.length - at - 4 < len) break;
      let msg: unknown = len === RELEASE_BODY_BYTES ? readRelease(buf, at + 4) : undefined;
      if (msg === undefined) {
        try {
          msg = unpack(buf.subarray(at + 4, at + 4 + len));
        } catch (e) {
          throw new ShmProtocolError(`Control frame is not msgpack: ${(e as Error).message}`);
        }
      }
      if (typeof msg !== "object" || msg === null || typeof (msg as { t?: unknown }).t !== "string") {
        throw new ShmProtocolError('Control frame is not a map with a string "t"');
      }
      out.push(msg as Record<string, unknown>);
      at += 4 + len;
    }
    // Keep only the unfinished tail (copied: the chunk may be a reused socket buffer).
    const tail = buf.length - at;
    if (buf !== chunk) this.#buf.copyWithin(0, at, buf.length);
    else if (tail > 0) {
      this.#reserve(tail);
      this.#buf.set(chunk.subarray(at), 0);
    }
    this.#held = tail;
    return out;
  }

  /** Room for `bytes` held bytes (at most a frame and a chunk: frames are bounded). */
  #reserve(bytes: number): void {
    if (this.#buf.length >= bytes) return;
    const bigger = new Uint8Array(Math.max(bytes, this.#buf.length * 2, 256));
    bigger.set(this.#buf.subarray(0, this.#held), 0);
    this.#buf = bigger;
  }
}

function roundUp(n: number, to: number): number {
  return Math.ceil(n / to) * to;
}
