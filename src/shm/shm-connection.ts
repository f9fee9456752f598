/**
 * @module One client of the shared-memory control socket: its handshake, then at most one
 * consumer, whose ring this connection fills in step order while the client releases slots.
 */

import * as net from "node:net";
import { setImmediate, setTimeout as unrefableTimeout } from "node:timers";
import {
  type AssembledBatch,
  assembleSamples,
  bodyBytes,
  cacheState,
  copiedOnThreads,
  copyResidentRuns,
  type ResidentRun,
  stepsPerCopy,
  takeResident,
} from "../batch/assemble-batch.ts";
import type { RegisteredDataset } from "../batch/dataset-catalog.ts";
import type { ConsumerKey } from "../batch/read-ahead.ts";
import { fullSteps, MAX_MICRO_BATCH, MAX_WORLD, stepSamples } from "../batch/steps.ts";
import { type ErrorCode, isCacheServerError } from "../errors.ts";
import { STATUS_OF } from "../http/error-handler.ts";
import { constantTimeEqual } from "../http/middleware/bearer-auth.ts";
import {
  concatFrames,
  decodeTimings,
  type DecodedTimings,
  encodeFrame,
  FrameDecoder,
  MAX_RING_SLOTS,
  MIN_RING_BYTES,
  ringLayout,
  type RingLayout,
  type ServerMessage,
  SHM_PROTOCOL_VERSION,
  ShmProtocolError,
  slotOfStep,
} from "./protocol.ts";
import { RingFile, RingSpaceError } from "./ring-file.ts";
import type { RingPool } from "./ring-pool.ts";
import type { PeerCredentials, PeerIdentity, ShmServerOptions } from "./shm-server.ts";

/** A connection that has not said `hello` within this time is closed. */
const HELLO_TIMEOUT_MS = 5000;
/**
 * A connection that has not asked for a consumer (`open`) within this time of connecting is
 * closed: connections are capped, and peers that greet and then sit idle could take every one.
 */
const OPEN_TIMEOUT_MS = 30_000;
/** Control frames a client may leave unread (notices are ~80 bytes) before it is disconnected. */
const MAX_UNREAD_BYTES = 2 ** 20;
/**
 * After an error frame the server half-closes and lets the peer read it; a peer that then keeps
 * its end open is cut off after this long (else it would hold a connection slot, and shutdown).
 */
const END_GRACE_MS = 1000;
/**
 * Bytes read after a `DATASET_REPLACED` end, for the peer's `timings` (a report of 1024 steps is
 * ~33 KiB): what a client wrote before it read the end, not a stream.
 */
const MAX_DRAIN_BYTES = 256 * 1024;
/**
 * How long a connection ended by a `DATASET_REPLACED` is read on for those `timings` before it is
 * cut: a polling client reads on through the slots its ring holds (up to 64 steps of training)
 * before it reads its socket and closes, and its reports of them went to a destroyed socket
 * after `END_GRACE_MS` (a soak lost ~0.2 % of t_wait counts that way). The SDK closes as soon as
 * it reads the end; only a client that never does waits this out.
 */
const DRAIN_GRACE_MS = 120_000;
/**
 * Messages received whose handling has not started (they are handled in order, and `open` awaits
 * the catalog and its ring's pages) past which the socket is paused: a peer that floods frames meanwhile
 * then waits in the kernel's socket buffer, not in this process's heap.
 */
const MAX_UNSTARTED_MESSAGES = 256;
/** `wait`s a consumer may have outstanding (unpublished steps), per slot of its ring; more is error 400. */
const MAX_WAITS_PER_SLOT = 2;
/** Batch notices of a `notify: "all"` consumer wait at most this long to be sent together. */
const NOTICE_DELAY_MS = 1;
/**
 * A fill loop whose blocks are all in memory never leaves the microtask queue: after this long
 * it lets the event loop run once, so HTTP requests, other sockets and this client's `wait`
 * are not starved by a burst of slots.
 */
const FILL_SLICE_MS = 2;
/** The most steps whose batches are copied together (see `stepsPerCopy`). */
const MAX_STEPS_PER_COPY = 32;

/** One client connection: the handshake, then at most one consumer and its ring. */
export class ShmConnection {
  readonly #socket: net.Socket;
  readonly #pool: RingPool;
  readonly #o: ShmServerOptions;
  readonly #decoder = new FrameDecoder();
  #greeted = false;
  /** Who is at the other end, when the runtime can tell. */
  readonly #peer: PeerCredentials | undefined;
  #ring: RingFile | undefined;
  #closed = false;
  /**
   * Bytes still taken after an end the client did not cause (its dataset replaced), for its
   * `timings` only; undefined: nothing more is read (see `end`).
   */
  #drainLeft: number | undefined;
  /** Generation of each slot the client holds (filled and not released). */
  readonly #held = new Map<number, number>();
  #wake: (() => void) | undefined;
  /** The consumer's round: where step `s` goes, and how notices are sent. */
  #round: { startStep: number; endStep: number; slots: number; notify: "all" | "wait" } | undefined;
  /** Steps published so far, from `startStep`: `[startStep, #published)`. */
  #published = 0;
  /**
   * `notify: "wait"`: steps the client asked to hear of and that are not published yet, with how
   * many `wait`s asked for each: each is answered (the SDK waits for one step at a time, once;
   * another client may ask for several steps, or ask again).
   */
  readonly #waitingFor = new Map<number, number>();
  /** Batch notices not written yet (`notify: "all"`): sent together, one write for several. */
  #pending: Uint8Array[] = [];
  #pendingTimer: ReturnType<typeof setTimeout> | undefined;
  /** The last notices of this consumer, by step, so that a `wait` for a published step is answered. */
  readonly #notices = new Map<number, ServerMessage>();
  #pump: Promise<void> | undefined;
  /** When the last batch was published (clock ms): a batch filled alongside another is timed from here. */
  #lastPublish = -Infinity;
  /** Whether the peer has asked for its consumer (`open`), however that ended. */
  #opened = false;
  /** Stops a ring's allocation in progress (`end()`), so no half-written ring outlives the connection. */
  #creating: AbortController | undefined;
  /** Settles when `#open` has finished (its ring made, refused or given up). */
  #opening: Promise<void> | undefined;
  /** Messages are handled one at a time, in order: `open` awaits the catalog. */
  #queue: Promise<void> = Promise.resolve();
  /** The consumer's `endStep`, once `end` has been sent: a `wait` at or past it is answered with `end` again. */
  #endedAt: number | undefined;
  /** The client sent `stop`: nothing more is filled, published or held. */
  #stopped = false;
  /** The opened consumer's dataset: the label of its `timings`. */
  #dataset: string | undefined;
  /** The dataset version this consumer's ring is filled from (see `versionReplaced`). */
  #reg: RegisteredDataset | undefined;
  /** Messages in `#queue` whose handling has not started (the socket pauses past `MAX_UNSTARTED_MESSAGES`). */
  #notStarted = 0;
  /** Messages in `#queue` not yet handled to their end (an `open` awaits the catalog): later step messages wait behind them. */
  #notFinished = 0;

  /**
   * @param socket the accepted connection
   * @param pool where its ring comes from and goes back to
   * @param o the server's options
   */
  constructor(socket: net.Socket, pool: RingPool, o: ShmServerOptions) {
    this.#socket = socket;
    this.#pool = pool;
    this.#o = o;
    this.#peer = peerOf(o.peers, socket);
    socket.on("data", (chunk: Uint8Array) => {
      // After an error (or the end) nothing more is read: a decoder fed on would keep every byte.
      if (this.#closed) {
        if (this.#drainLeft !== undefined) this.#drainTimings(chunk);
        return;
      }
      let msgs;
      try {
        msgs = this.#decoder.push(chunk);
      } catch (e) {
        this.#fail("BAD_REQUEST", (e as Error).message);
        return;
      }
      for (let m of msgs) {
        // Before a hello (none waiting to be handled) it is refused as any message would be.
        if (m.t === "timings" && (this.#greeted || this.#notFinished > 0)) {
          // Copied out now: its arrays are views of the decoder's buffer, which the next chunk reuses.
          try {
            m = decodeTimings(m) as unknown as Record<string, unknown>;
          } catch (e) {
            this.#failWith(e);
            return;
          }
        }
        // Releases, waits and timings are handled at once when nothing waits before them: a
        // promise chain per message cost the event loop more than the release itself. Anything
        // behind an `open` still being handled waits its turn, in order.
        if (this.#notFinished === 0 && this.#greeted && (m.t === "release" || m.t === "wait" || m.t === "timings")) {
          try {
            this.#handleStepMessage(m);
          } catch (e) {
            this.#failWith(e);
          }
          continue;
        }
        this.#notStarted++;
        this.#notFinished++;
        this.#queue = this.#queue.then(() => {
          if (--this.#notStarted === 0 && this.#socket.isPaused()) this.#socket.resume();
          return this.#handle(m);
        }).catch((e) => this.#failWith(e)).finally(() => this.#notFinished--);
      }
      if (this.#notStarted > MAX_UNSTARTED_MESSAGES) socket.pause();
    });
    socket.on("error", () => {}); // a peer that vanished; "close" follows and cleans up
    socket.once("close", () => void this.end({ peerClosed: true }));
    const helloTimer = setTimeout(() => {
      if (!this.#greeted) this.#fail("BAD_REQUEST", `No "hello" within ${HELLO_TIMEOUT_MS} ms`);
    }, HELLO_TIMEOUT_MS);
    const openTimer = setTimeout(() => {
      if (!this.#opened) this.#fail("BAD_REQUEST", `No "open" within ${o.openTimeoutMs ?? OPEN_TIMEOUT_MS} ms of connecting`);
    }, o.openTimeoutMs ?? OPEN_TIMEOUT_MS);
    socket.once("close", () => {
      clearTimeout(helloTimer);
      clearTimeout(openTimer);
    });
  }

  /** Waits for an `open` in progress to finish (its ring made, refused or stopped). */
  opened(): Promise<void> {
    return (this.#opening ?? Promise.resolve()).catch(() => {});
  }

  /**
   * Ends the consumer if its ring is filled from `old`, a dataset version just replaced: the
   * client reconnects and resumes at its next step on the new version (the SDK does so by itself),
   * as an HTTP consumer's next request gets it. Batches already in the ring are still the old
   * version's; nothing after them is.
   */
  versionReplaced(old: RegisteredDataset): void {
    if (this.#reg !== old || this.#closed) return;
    // The client did nothing wrong, and may have written step timings it takes as delivered
    // before it reads this: those are still taken (a soak re-registering under load lost 4-9 % of
    // a consumer's t_wait counts), nothing else, and at most a bounded amount.
    this.#drainLeft = MAX_DRAIN_BYTES;
    this.#fail("DATASET_REPLACED", `Dataset "${old.name}" was replaced by a new version (registered again, or its files changed): reconnect and resume at the next step`);
  }

  /** Takes the `timings` of a peer whose consumer the server ended (see `versionReplaced`), and nothing else. */
  #drainTimings(chunk: Uint8Array): void {
    this.#drainLeft! -= chunk.length;
    let msgs;
    try {
      if (this.#drainLeft! < 0) throw new Error("more than the drain takes");
      msgs = this.#decoder.push(chunk);
      for (const m of msgs) if (m.t === "timings") this.#timings(decodeTimings(m));
    } catch {
      // Anything malformed, or too much: nothing more is read, as after any other end.
      this.#drainLeft = undefined;
      this.#socket.pause();
    }
  }

  /** The fill loop fills and publishes nothing more: the connection is over, or its client said `stop`. */
  get #fillOver(): boolean {
    return this.#closed || this.#stopped;
  }

  /** Whether this connection's consumer has a ring now (for `ShmServer.stats`). */
  get hasRing(): boolean {
    return this.#ring !== undefined;
  }

  /**
   * Stops filling and takes the ring's name away at once (`RingPool.retire`); once the fill loop has
   * stopped, the ring is kept for the next consumer or unmapped and removed (`RingPool.keep`).
   *
   * @param how `graceful`: let frames already written (an error) reach the client before the
   *   socket closes; `peerClosed`: the client closed the connection itself (the socket's "close"):
   *   only then may its ring be kept
   */
  // deno-lint-ignore require-await -- async so that callers always get a promise (`void this.end()`)
  async end(how: { graceful?: boolean; peerClosed?: boolean } = {}): Promise<void> {
    const { graceful = false, peerClosed = false } = how;
    // Its ring may serve another consumer only if the peer itself closed the connection having
    // released every slot (the SDK also gives its mapping back first). A peer the server cut off
    // (an error frame, a fill that failed) does not know yet and may still read its slots, and
    // one that holds a batch (an abort in the middle of a step) may still be reading that batch:
    // handed to another consumer, the ring would turn them into that consumer's tokens.
    const reusable = peerClosed && !this.#closed && this.#held.size === 0;
    this.#creating?.abort();
    if (!this.#closed) {
      this.#flush(); // notices already due go out before an error frame and the close
      this.#closed = true;
      this.#wake?.();
      if (graceful) {
        // Nothing more is read (a peer may keep sending): what it sends waits in its own socket.
        // Only a consumer the server ended through no fault of its own is read on, for its timings.
        if (this.#drainLeft === undefined) this.#socket.pause();
        this.#socket.end();
        unrefableTimeout(() => this.#socket.destroy(), this.#drainLeft === undefined ? END_GRACE_MS : DRAIN_GRACE_MS).unref();
      } else this.#socket.destroy();
    } else if (!graceful) this.#socket.destroy(); // shutdown does not wait out the grace

    const ring = this.#ring;
    if (!ring) return;
    this.#ring = undefined;
    // Its ring name goes now (renamed .spare, or removed). The mapping stays until the fill loop
    // has stopped: it may be waiting on an origin and then copy into its slot, and unmapping
    // under it would fault. Shutdown does not wait for that origin. Then the ring is kept for the
    // next consumer, or removed. A spare left by a process that dies is removed at the next
    // start, with the rings of dead servers.
    this.#pool.retire(ring, reusable);
    void (this.#pump ?? Promise.resolve()).then(() => this.#pool.keep(ring));
  }

  #send(m: ServerMessage): void {
    if (this.#closed) return;
    this.#flush();
    this.#write(encodeFrame(m));
  }

  /**
   * Writes control frames. A client that stops reading them (notices it polls past, or `wait`s
   * it never reads the answers to) would make Node buffer them without bound: past
   * `MAX_UNREAD_BYTES` the connection is closed instead (its ring goes with it).
   */
  #write(bytes: Uint8Array): void {
    if (this.#closed) return;
    this.#socket.write(bytes);
    if (this.#socket.writableLength > MAX_UNREAD_BYTES) {
      this.#o.log(`rackfeed: closing a shared-memory client that left ${this.#socket.writableLength} bytes of control frames unread`);
      void this.end();
    }
  }

  /**
   * Tells the client of a published batch. `notify: "wait"` consumers poll the ring and hear of a
   * batch only when they blocked on it; `all` consumers hear of every batch, a group at a time
   * while they are not starving (at most `slots / 4` notices or `NOTICE_DELAY_MS` held back).
   */
  #notify(m: ServerMessage & { t: "batch" }): void {
    const round = this.#round!;
    if (round.notify === "wait") {
      this.#notices.set(m.step, m);
      this.#notices.delete(m.step - round.slots);
      const waits = this.#waitingFor.get(m.step);
      if (waits !== undefined) {
        this.#waitingFor.delete(m.step);
        this.#flush();
        const frame = encodeFrame(m);
        for (let i = 0; i < waits && !this.#closed; i++) this.#write(frame);
      }
      return;
    }
    this.#pending.push(encodeFrame(m));
    // A client holding no other batch is waiting for this one: tell it now.
    if (this.#held.size === 1 || this.#pending.length >= Math.max(1, round.slots >> 2)) this.#flush();
    else this.#pendingTimer ??= setTimeout(() => this.#flush(), NOTICE_DELAY_MS);
  }

  /** Writes the notices held back, in one write. */
  #flush(): void {
    if (this.#pendingTimer !== undefined) clearTimeout(this.#pendingTimer);
    this.#pendingTimer = undefined;
    if (this.#pending.length === 0) return;
    const frames = this.#pending;
    this.#pending = [];
    this.#write(frames.length === 1 ? frames[0] : concatFrames(frames));
  }

  /** Sends an error frame (its status from the one error table) and ends the connection. */
  #fail(code: ErrorCode | "INTERNAL", message: string): void {
    const status = code === "INTERNAL" ? 500 : STATUS_OF[code];
    this.#send({ t: "error", code, status, message });
    void this.end({ graceful: true });
  }

  #failWith(e: unknown): void {
    if (isCacheServerError(e)) this.#fail(e.code, e.message);
    else if (e instanceof ShmProtocolError) this.#fail("BAD_REQUEST", e.message);
    else {
      this.#o.log("rackfeed: shared-memory connection failed", e);
      this.#fail("INTERNAL", "Internal server error");
    }
  }

  async #handle(m: Record<string, unknown>): Promise<void> {
    if (this.#closed) return;
    if (!this.#greeted) {
      if (m.t !== "hello") throw new ShmProtocolError(`Expected "hello" first, got "${String(m.t)}"`);
      if (m.version !== SHM_PROTOCOL_VERSION) {
        throw new ShmProtocolError(`Protocol version ${String(m.version)} is not supported: this server speaks ${SHM_PROTOCOL_VERSION}`);
      }
      // A peer running as our own user (or root) could read the token from our configuration
      // anyway: its Unix credentials authenticate it. Anyone else must know the token.
      const peer = this.#peer;
      const sameUser = peer !== undefined && (peer.uid === this.#o.peers?.uid || peer.uid === 0);
      if (this.#o.readToken !== undefined && !sameUser && !(typeof m.token === "string" && constantTimeEqual(m.token, this.#o.readToken))) {
        const who = peer ? ` (peer pid ${peer.pid} runs as uid ${peer.uid}, not as this server's uid ${this.#o.peers?.uid})` : "";
        this.#fail("UNAUTHORIZED", `Missing or wrong read token: send it as "token" in "hello"${who}`);
        return;
      }
      this.#greeted = true;
      this.#send({ t: "welcome", version: SHM_PROTOCOL_VERSION, instance: this.#o.instance, stop: true, ...(this.#o.onTimings ? { timings: true } : {}) });
      return;
    }
    if (m.t === "open") return await (this.#opening = this.#open(m));
    this.#handleStepMessage(m);
  }

  /** Handles a message of a greeted peer other than `open`: a `release`, a `wait`, `timings`, or an error. */
  #handleStepMessage(m: Record<string, unknown>): void {
    if (this.#closed) return;
    if (m.t === "release") return this.#release(m);
    if (m.t === "wait") return this.#wait(m);
    if (m.t === "timings") return this.#timings(m as unknown as DecodedTimings);
    if (m.t === "stop") return this.#stop();
    throw new ShmProtocolError(`Unknown message "${String(m.t)}": expected open, release, wait, timings or stop`);
  }

  /**
   * The client reads no more of the ring: no slot is filled or published from here on, and every
   * published one counts as released (the client says it holds none, as a release would; only
   * `timings` may follow). Its ring may then serve the next consumer once the client closes the
   * connection, once the copies in flight have landed (`end` waits for the fill loop).
   */
  #stop(): void {
    if (!this.#ring) throw new ShmProtocolError('"stop" needs an open consumer: send "open" first');
    this.#stopped = true;
    this.#held.clear();
    this.#pending.length = 0;
    this.#wake?.();
  }

  /** Hands a `timings` message's steps to the metrics, under the connection's dataset. */
  #timings(m: DecodedTimings): void {
    const onTimings = this.#o.onTimings;
    if (!onTimings) throw new ShmProtocolError('This server takes no "timings" (its "welcome" did not offer them): report them over HTTP');
    if (this.#dataset === undefined) throw new ShmProtocolError('"timings" needs an open consumer: send "open" first');
    for (let i = 0; i < m.count; i++) {
      const w = m.tWait[i], h = m.tH2d[i], c = m.tCompute[i];
      onTimings(this.#dataset, { t_wait: w === w ? w : undefined, t_h2d: h === h ? h : undefined, t_compute: c === c ? c : undefined });
    }
  }

  async #open(m: Record<string, unknown>): Promise<void> {
    this.#opened = true;
    if (this.#ring) throw new ShmProtocolError('One "open" per connection: open another connection for another consumer');
    const world = int(m, "world", 1, MAX_WORLD);
    const rank = int(m, "rank", 0, world - 1);
    const microBatch = int(m, "microBatch", 1, MAX_MICRO_BATCH);
    const startStep = int(m, "startStep", 0, Number.MAX_SAFE_INTEGER);
    const asked = m.slots === undefined ? this.#o.slots : int(m, "slots", 1, MAX_RING_SLOTS);
    if (typeof m.dataset !== "string") throw new ShmProtocolError('"dataset" must be a string');
    if (m.notify !== undefined && m.notify !== "all" && m.notify !== "wait") {
      throw new ShmProtocolError(`Invalid "notify": ${JSON.stringify(m.notify)}; expected "all" or "wait"`);
    }
    const reg = await this.#o.catalog.get(m.dataset);
    if (this.#closed) return; // the peer left while the catalog answered: make no ring
    // Known from here, not once the ring is made: a version replaced while the ring's pages are
    // written (milliseconds) must end this consumer too (`versionReplaced`), or it would be filled
    // from the old version to its last step.
    this.#reg = reg;
    const steps = fullSteps(reg.dataset.numSamples, world, microBatch);
    const endStep = m.endStep === undefined ? steps : Math.min(int(m, "endStep", 0, Number.MAX_SAFE_INTEGER), steps);
    const cols = reg.dataset.windowLength;
    const batchBytes = bodyBytes(reg, microBatch);
    if (batchBytes > this.#o.maxBatchBytes) {
      this.#fail("BAD_REQUEST", `A batch of ${microBatch} × ${cols} tokens = ${batchBytes} bytes exceeds --max-batch-bytes (${this.#o.maxBatchBytes})`);
      return;
    }
    // Small batches get a deeper ring when the budget and the directory have room for it; else
    // the size asked.
    const deep = ringLayout(Math.max(asked, Math.min(MAX_RING_SLOTS, Math.floor(MIN_RING_BYTES / batchBytes))), batchBytes);
    const sizes = deep.slots > asked ? [deep, ringLayout(asked, batchBytes)] : [deep];
    const made = await this.#makeRing(sizes);
    if (made === undefined) return; // the connection ended meanwhile, and the ring is gone
    if (typeof made === "string") {
      // SHM_FULL: the SDK falls back to HTTP for this consumer.
      this.#fail("SHM_FULL", made);
      return;
    }
    if (this.#closed) {
      // The peer left (or the server is stopping) while the ring was made: `end()` has run and
      // did not see it, so it goes here, file and budget.
      made.close();
      this.#pool.release(made.layout.fileBytes);
      return;
    }
    this.#ring = made;
    const layout = this.#ring.layout;
    const slots = layout.slots;
    this.#round = { startStep, endStep, slots, notify: m.notify === "wait" ? "wait" : "all" };
    this.#dataset = reg.name;
    this.#send({
      t: "ring",
      path: this.#ring.path,
      slots,
      slotBytes: layout.slotBytes,
      dataOffset: layout.dataOffset,
      fileBytes: layout.fileBytes,
      dtype: reg.dataset.dtype,
      rows: microBatch,
      cols,
      endStep,
    });
    this.#pump = this.#fill(reg, { dataset: reg.name, rank, world, microBatch }, startStep, endStep).catch((e) => this.#failWith(e));
  }

  /**
   * The consumer's ring: a spare one of the first layout that has one kept, else a new one of the
   * first that fits the budget and the directory (spare rings are dropped for room when that
   * helps).
   *
   * @returns the ring; or why none fits (SHM_FULL); or undefined when `end()` stopped its
   *   allocation (its file removed, its budget given back)
   */
  async #makeRing(sizes: readonly RingLayout[]): Promise<RingFile | string | undefined> {
    let refusal = "";
    for (let i = 0; i < sizes.length; i++) {
      const layout = sizes[i];
      const spare = this.#pool.take(layout);
      if (spare) return spare;
      const path = this.#pool.reserve(layout.fileBytes);
      if (path === undefined) {
        refusal = `Shared-memory budget (--shm-bytes ${this.#o.budgetBytes}) is full; a ring of ${layout.fileBytes} bytes does not fit`;
        continue;
      }
      let ring: RingFile;
      const creating = (this.#creating = new AbortController());
      try {
        ring = await RingFile.create(path, layout, this.#o.mapFile, creating.signal);
      } catch (e) {
        this.#pool.release(layout.fileBytes);
        if (creating.signal.aborted) return undefined; // `end()` stopped it, and the file is gone
        if (!(e instanceof RingSpaceError)) throw e;
        // The spare rings' pages make room: the same size again without them.
        if (this.#pool.dropSpares()) {
          i--;
          continue;
        }
        refusal = `${e.message}: ${this.#o.dir} is full; grow it or lower --shm-bytes`;
        continue;
      }
      return ring;
    }
    return refusal;
  }

  #release(m: Record<string, unknown>): void {
    const slot = int(m, "slot", 0, Number.MAX_SAFE_INTEGER);
    const generation = m.generation;
    if (this.#held.get(slot) !== generation) {
      throw new ShmProtocolError(`Release of slot ${slot} generation ${String(generation)}, which the client does not hold`);
    }
    this.#held.delete(slot);
    // notify "all": a client that now holds only batches whose notices are still held back is
    // about to wait for them.
    if (this.#pending.length > 0 && this.#held.size <= this.#pending.length) this.#flush();
    this.#wake?.();
  }

  #wait(m: Record<string, unknown>): void {
    const step = int(m, "step", 0, Number.MAX_SAFE_INTEGER);
    const round = this.#round;
    if (!round || round.notify !== "wait") throw new ShmProtocolError('"wait" needs an open consumer with notify "wait"');
    if (step >= round.endStep) {
      // Past the last step: answered by `end`, at once if it has been sent, else by the one
      // `end` that follows the last step's publication (no error: a client that polls does not
      // know the ring's end is near, and queueing would answer it twice).
      if (this.#endedAt !== undefined) this.#send({ t: "end", step: this.#endedAt });
    } else if (step < round.startStep + this.#published) {
      const notice = this.#notices.get(step);
      if (!notice) throw new ShmProtocolError(`Wait for step ${step}, which the ring no longer holds (this consumer started at step ${round.startStep})`);
      this.#send(notice);
    } else {
      // A step within a ring's length of the next one can be published before the client
      // releases more; anything further is a client error, and the set stays bounded.
      const next = round.startStep + this.#published;
      if (step >= next + round.slots) {
        throw new ShmProtocolError(`Wait for step ${step}: the next step published is ${next}, and the ring holds ${round.slots} steps ahead`);
      }
      // Each wait is answered: bounded, so a peer cannot queue a flood of answers for one publish
      // (the steps waited for are fewer than a ring's slots: the sum is cheap).
      let waits = 0;
      for (const n of this.#waitingFor.values()) waits += n;
      if (waits >= MAX_WAITS_PER_SLOT * round.slots) {
        throw new ShmProtocolError(`Too many waits outstanding (${waits}): at most ${MAX_WAITS_PER_SLOT} per slot of the ring (${round.slots} slots)`);
      }
      this.#waitingFor.set(step, (this.#waitingFor.get(step) ?? 0) + 1);
    }
  }

  /**
   * Fills slots in step order, each step in its slot of the round, while the client releases them.
   * A copy on the copier's threads overlaps the planning of the next one: batches copied on the
   * threads by themselves are filled two at a time; small batches whose blocks are all in memory
   * are copied several steps at once (`stepsPerCopy`), one such group on the threads while the
   * next is planned. Others, one at a time.
   */
  async #fill(reg: RegisteredDataset, consumer: ConsumerKey, from: number, end: number): Promise<void> {
    const ring = this.#ring!;
    const slots = ring.layout.slots;
    const copier = this.#o.copier;
    // Only into a mapped ring (an unmapped one assembles every slot in one scratch buffer) and
    // only where the copy leaves the event loop (else there is nothing to overlap).
    const overlap = ring.inPlace && slots > 1;
    const depth = overlap && copiedOnThreads(copier, reg, consumer.microBatch) ? 2 : 1;
    // Half the ring at most: a group is planned while the one before it is still being copied.
    const group = overlap && depth === 1 ? stepsPerCopy(copier, reg, consumer.microBatch, Math.min(MAX_STEPS_PER_COPY, slots >> 1)) : 1;
    const inFlight: Filling[] = [];
    let failed = false;
    let unit = 0; // a step filled alone, or a group copied together
    try {
      let sliceStart = this.#o.now();
      for (let step = from; step < end;) {
        // A step in flight failed: start no more, and let `#publishOldest` raise its error.
        if (failed && !(await this.#publishBefore(inFlight, Infinity, reg, consumer))) return;
        const { slot, generation } = slotOfStep(step, from, slots);
        if (this.#held.has(slot)) {
          // The client may be waiting for a batch still being copied: publish those first.
          if (!(await this.#publishBefore(inFlight, Infinity, reg, consumer))) return;
          this.#flush(); // the client must hear of every batch before we sleep on its releases
          while (this.#held.has(slot) && !this.#fillOver) await new Promise<void>((r) => (this.#wake = r));
          // Releases come a group at a time, in one chunk: the first wakes this loop. Let the rest
          // be handled too, so that the steps after this one can be copied with it.
          if (group > 1) await this.#queue;
          sliceStart = this.#o.now();
        } else if (this.#o.now() - sliceStart > FILL_SLICE_MS) {
          await new Promise<void>((r) => setImmediate(r));
          sliceStart = this.#o.now();
        }
        if (this.#fillOver) return;
        unit++;
        const t0 = this.#o.now();
        const runs = group > 1 ? this.#residentRuns(reg, consumer, step, Math.min(group, end - step, slots - inFlight.length), from) : [];
        if (runs.length > 0) {
          const at = runs.map((_, i) => slotOfStep(step + i, from, slots));
          const copied = copyResidentRuns(copier!, reg, runs, at.map((a, i) => ring.target(a.slot, runs[i].bytes)), this.#o.now, t0);
          copied.catch(() => (failed = true));
          runs.forEach((r, i) => inFlight.push({ step: step + i, ...at[i], first: r.first, t0, unit, batch: copied, index: i }));
          step += runs.length;
          // Publish the group before this one (its copy has had this group's planning to land).
          if (!(await this.#publishBefore(inFlight, unit, reg, consumer))) return;
          continue;
        }
        const first = stepSamples(step, consumer.rank, consumer.world, consumer.microBatch);
        const batch = assembleSamples(this.#o.cache, reg, first, consumer.microBatch, this.#o.maxBatchBytes, { now: this.#o.now, into: ring.target(slot), copier, plansAhead: this.#o.readAhead.plansAhead });
        // Awaited in order below; a later step failing first must not count as an unhandled rejection.
        batch.catch(() => (failed = true));
        inFlight.push({ step, slot, generation, first, t0, unit, batch, index: -1 });
        step++;
        // Steps filled alone are units of one: the newest `depth - 1` stay in flight while the
        // next is planned (none with depth 1: this one is published now).
        const keptInFlight = depth - 1;
        if (!(await this.#publishBefore(inFlight, unit + 1 - keptInFlight, reg, consumer))) return;
      }
      if (!(await this.#publishBefore(inFlight, Infinity, reg, consumer))) return;
      this.#endedAt = end;
      this.#send({ t: "end", step: end });
    } catch (e) {
      // Reported at once, not after the other step's fetch: this closes the connection and
      // unlinks the ring, whose mapping goes only once this returns (see `end()`).
      this.#failWith(e);
    } finally {
      // Copies still running write into the ring: `end()` unmaps it only once this has returned.
      await Promise.allSettled(inFlight.map((f) => f.batch));
    }
  }

  /**
   * Steps `[step, step + most)` that can be copied together: consecutive, their slots free, their
   * blocks all in memory. Stops at the first that is not (it is filled alone, as is a step whose
   * planning fails: its error is raised in order); empty when `step` itself is not.
   */
  #residentRuns(reg: RegisteredDataset, consumer: ConsumerKey, step: number, most: number, from: number): ResidentRun[] {
    const runs: ResidentRun[] = [];
    const slots = this.#ring!.layout.slots;
    for (let s = step; s < step + most; s++) {
      if (s > step && this.#held.has(slotOfStep(s, from, slots).slot)) break;
      let run: ResidentRun | undefined;
      try {
        run = takeResident(this.#o.cache, reg, stepSamples(s, consumer.rank, consumer.world, consumer.microBatch), consumer.microBatch, this.#o.maxBatchBytes, this.#o.readAhead.plansAhead);
      } catch {
        break;
      }
      if (run === undefined) break;
      runs.push(run);
    }
    return runs;
  }

  /** Publishes the units in flight older than `unit`, oldest first; false when the connection has closed meanwhile. */
  async #publishBefore(inFlight: Filling[], unit: number, reg: RegisteredDataset, consumer: ConsumerKey): Promise<boolean> {
    while (inFlight.length > 0 && inFlight[0].unit < unit) if (!(await this.#publishOldest(inFlight, reg, consumer))) return false;
    return true;
  }

  /**
   * Publishes the oldest batch in flight once it is assembled, with the rest of its group (steps
   * copied together land together); false when the connection has closed meanwhile.
   */
  async #publishOldest(inFlight: Filling[], reg: RegisteredDataset, consumer: ConsumerKey): Promise<boolean> {
    const done = await inFlight[0].batch;
    if (this.#fillOver) return false;
    const unit = inFlight[0].unit;
    let n = 1;
    if (Array.isArray(done)) while (n < inFlight.length && inFlight[n].unit === unit) n++;
    // The unit's own time, shared by its steps: from its start, or from the previous publish if
    // it started before (two in flight share the threads, so its wait behind the other is not its cost).
    const now = this.#o.now();
    const seconds = (now - Math.max(inFlight[0].t0, this.#lastPublish)) / 1000 / n;
    this.#lastPublish = now;
    for (const f of inFlight.splice(0, n)) this.#publish(f, Array.isArray(done) ? done[f.index] : (done as AssembledBatch), seconds, reg, consumer);
    return true;
  }

  /** Writes a step's slot header and tells the client; counts the batch. */
  #publish(f: Filling, batch: AssembledBatch, seconds: number, reg: RegisteredDataset, consumer: ConsumerKey): void {
    const { step, slot, generation, first } = f;
    const cache = cacheState(batch);
    this.#ring!.publish(slot, batch.body, { generation, length: batch.body.length, step, firstSample: first, cache });
    this.#held.set(slot, generation);
    this.#published++;
    this.#notify({ t: "batch", slot, generation, step, length: batch.body.length, firstSample: first, cache });
    this.#o.served.add("shm", batch.body.length);
    this.#o.onBatch(seconds, cache);
    this.#o.stats.record(reg.name, () => `shm rank ${consumer.rank}/${consumer.world} × ${consumer.microBatch} step ${step}`, batch, seconds);
    this.#o.readAhead.observe(reg, consumer, step);
  }
}

/** A step whose batch is being assembled into its slot, not yet published. */
interface Filling {
  readonly step: number;
  readonly slot: number;
  readonly generation: number;
  readonly first: number;
  readonly t0: number;
  /** The step's fill: its own, or its group's (steps copied together share one). */
  readonly unit: number;
  /** The step's batch, or its group's batches: then the step's is at `index`. */
  readonly batch: Promise<AssembledBatch | readonly AssembledBatch[]>;
  readonly index: number;
}

/** A peer's credentials, or undefined when they cannot be read (then the read token decides). */
function peerOf(peers: PeerIdentity | undefined, socket: net.Socket): PeerCredentials | undefined {
  try {
    return peers?.of(socket);
  } catch {
    return undefined;
  }
}

function int(m: Record<string, unknown>, name: string, min: number, max: number): number {
  const v = m[name];
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) {
    throw new ShmProtocolError(`Invalid "${name}": ${JSON.stringify(v)}; expected an integer from ${min} to ${max}`);
  }
  return v;
}
