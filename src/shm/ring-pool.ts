/**
 * @module The rings of the shm path as a whole: their byte budget (`--shm-bytes`), their file
 * names, and the rings of ended consumers kept for the next consumer of the same layout
 * (`--shm-spare-rings`). A connection takes its ring from here and gives it back here.
 */

import { setTimeout as unrefableTimeout } from "node:timers";
import type { RingLayout } from "./protocol.ts";
import { RING_PREFIX, type RingFile } from "./ring-file.ts";

/** How long a spare ring is kept unused before it is removed (ms). */
export const SPARE_RING_MS = 10_000;

/** What a `RingPool` needs: where rings live, whose they are, and its bounds. */
export interface RingPoolOptions {
  readonly dir: string;
  /** The server's pid and instance id, in every ring's name (dead servers' rings are found by them). */
  readonly pid: number;
  readonly instance: string;
  /** Bytes of all ring files together, spare ones included. */
  readonly budgetBytes: number;
  /** Rings of ended consumers kept at most (0: none is kept). */
  readonly spareRings: number;
  /** How long a spare ring is kept unused, in ms (default `SPARE_RING_MS`). */
  readonly spareRingMs?: number;
  readonly now: () => number;
  readonly log: (message: string, err?: unknown) => void;
}

/**
 * The byte budget and names of rings, and the spare rings. A new ring's pages and mapping cost
 * ~3 ms of the event loop per consumer, most of it full collections (V8 counts each mapping as
 * external memory); a trainer's next epoch, another rank, or a benchmark's next pass starts on a
 * kept ring instead.
 *
 * A ring's life here: `reserve` (its bytes and name) or `take` (a spare one); when its consumer
 * ends, `retire` (its name goes at once), then, once no fill writes into it, `keep` (kept as a
 * spare, or removed and its bytes given back).
 */
export class RingPool {
  readonly #opts: RingPoolOptions;
  #ringSeq = 0;
  #bytes = 0;
  /** Rings kept for the next consumer (`keep`), oldest first, with when each was kept. */
  readonly #spares: { ring: RingFile; at: number }[] = [];
  /** Rings renamed `.spare` whose fills have not stopped yet (`retire` → `keep`). */
  readonly #retiring = new Set<RingFile>();
  #spareTimer: ReturnType<typeof unrefableTimeout> | undefined;
  #closing = false;

  /** @param opts directory, owner, budget and spare-ring bounds */
  constructor(opts: RingPoolOptions) {
    this.#opts = opts;
  }

  /** Bytes of every ring file, spare ones included. */
  get bytes(): number {
    return this.#bytes;
  }

  /** Rings of ended consumers kept for the next one. */
  get spareCount(): number {
    return this.#spares.length;
  }

  /**
   * Reserves room for a ring in the budget and names its file; undefined when the budget is full
   * even without the spare rings (which are removed to make room).
   */
  reserve(bytes: number): string | undefined {
    let spareBytes = 0;
    for (const { ring } of this.#spares) spareBytes += ring.layout.fileBytes;
    // Only when dropping them makes the room (a smaller layout tried next may match one).
    if (this.#bytes - spareBytes + bytes <= this.#opts.budgetBytes) {
      while (this.#bytes + bytes > this.#opts.budgetBytes && this.#spares.length > 0) this.#dropOldestSpare();
    }
    if (this.#bytes + bytes > this.#opts.budgetBytes) return undefined;
    this.#bytes += bytes;
    return this.#ringName("ring");
  }

  /** Gives a ring's bytes back to the budget (a reserved ring that was not made). */
  release(bytes: number): void {
    this.#bytes -= bytes;
  }

  #ringName(kind: "ring" | "spare"): string {
    return `${this.#opts.dir}/${RING_PREFIX}${this.#opts.pid}-${this.#opts.instance}-${++this.#ringSeq}.${kind}`;
  }

  /**
   * A spare ring of exactly this layout, renamed to a new ring name, its budget still reserved;
   * undefined when none is kept.
   */
  take(layout: RingLayout): RingFile | undefined {
    // The rest of a layout (data offset, file size) follows from these two (`ringLayout`).
    const k = this.#spares.findIndex(({ ring: r }) => r.layout.slots === layout.slots && r.layout.slotBytes === layout.slotBytes);
    if (k < 0) return undefined;
    const { ring } = this.#spares.splice(k, 1)[0];
    try {
      ring.rename(this.#ringName("ring"));
      return ring;
    } catch (e) {
      this.#closeRing(ring, e);
      return undefined;
    }
  }

  /**
   * Takes an ended consumer's ring out of the ring names at once (its client is gone, and so is
   * its `.ring` file): renamed `.spare` to be kept for the next consumer (`keep`, once its fills
   * have stopped), else removed (its mapping stays until then).
   */
  retire(ring: RingFile, reusable: boolean): void {
    if (reusable && !this.#closing && this.#opts.spareRings > 0) {
      try {
        ring.rename(this.#ringName("spare"));
        this.#retiring.add(ring);
        return;
      } catch (e) {
        this.#opts.log(`rackfeed: ring ${ring.path} cannot be kept for the next consumer`, e);
      }
    }
    ring.unlink();
  }

  /**
   * Keeps a retired ring for the next consumer (see `RingFile.resetSlots`), or removes it and
   * gives its bytes back to the budget. Call only once no fill writes into it.
   */
  keep(ring: RingFile): void {
    const retired = this.#retiring.delete(ring);
    if (this.#closing || !retired) return this.#closeRing(ring);
    try {
      ring.resetSlots();
    } catch (e) {
      return this.#closeRing(ring, e);
    }
    this.#spares.push({ ring, at: this.#opts.now() });
    if (this.#spares.length > this.#opts.spareRings) this.#dropOldestSpare();
    this.#expireSpares();
  }

  /** Removes spare rings unused for their time, and looks again when the next one is due. */
  #expireSpares(): void {
    if (this.#spareTimer !== undefined) clearTimeout(this.#spareTimer);
    this.#spareTimer = undefined;
    const now = this.#opts.now();
    const keepMs = this.#opts.spareRingMs ?? SPARE_RING_MS;
    while (this.#spares.length > 0 && now - this.#spares[0].at >= keepMs) this.#dropOldestSpare();
    if (this.#spares.length === 0) return;
    const due = this.#spares[0].at + keepMs - now;
    // A kept ring does not keep the process alive.
    this.#spareTimer = unrefableTimeout(() => this.#expireSpares(), Math.max(1, due)).unref();
  }

  /** Removes every spare ring (a tmpfs with no room left for a new one); false when there was none. */
  dropSpares(): boolean {
    if (this.#spares.length === 0) return false;
    while (this.#spares.length > 0) this.#dropOldestSpare();
    return true;
  }

  /** Removes the oldest spare ring and gives its bytes back to the budget. */
  #dropOldestSpare(): void {
    this.#closeRing(this.#spares.shift()!.ring);
  }

  /** Unmaps and removes a ring, and gives its bytes back to the budget. */
  #closeRing(ring: RingFile, cause?: unknown): void {
    if (cause !== undefined) this.#opts.log(`rackfeed: ring ${ring.path} cannot be kept for the next consumer`, cause);
    try {
      ring.close();
    } catch (e) {
      this.#opts.log(`rackfeed: closing ring ${ring.path} failed`, e);
    }
    this.release(ring.layout.fileBytes);
  }

  /**
   * Shutdown: removes the spare rings, and keeps no more. A retiring ring whose fill still waits
   * (on an origin) loses its name now; its mapping and budget go when the fill stops (`keep`).
   */
  close(): void {
    this.#closing = true;
    this.dropSpares();
    for (const ring of this.#retiring) ring.unlink();
    if (this.#spareTimer !== undefined) clearTimeout(this.#spareTimer);
    this.#spareTimer = undefined;
  }
}
