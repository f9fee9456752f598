/** @module The `Origin` interface every store (filesystem, S3) implements, and the object metadata it returns. */

import type { ReadTiming } from "./part-sizer.ts";

/** What the cache needs to know about an object before reading it. */
export interface ObjectInfo {
  /** Length in bytes. */
  readonly size: number;
  /**
   * Opaque version (mtime+inode+size on a filesystem, the ETag on S3). It is part of every
   * block key, so bytes of two versions of one object can never be mixed.
   */
  readonly version: string;
  /** Strong HTTP entity tag derived from the version, quotes included. */
  readonly etag: string;
  /** Modification time, for `Last-Modified`. */
  readonly lastModified: Date;
}

/** One entry of a listing. */
export interface ListedObject {
  readonly key: string;
  readonly size: number;
}

/** Counters an origin with its own retry policy keeps (remote origins); read at scrape time. */
export interface OriginRequestStats {
  /** Attempts tried again after a failure. */
  readonly retries: number;
  /** Attempts that failed (retried or not; not-found answers excluded). */
  readonly failedAttempts: number;
  /** Attempts abandoned for want of an answer within the timeout. */
  readonly timeouts: number;
  /** Second requests sent for a read much slower than its peers. */
  readonly hedges: number;
  /** Hedged requests that finished first. */
  readonly hedgeWins: number;
}

/**
 * A store of objects addressed by validated keys (see `origin/object-key.ts`). Implementations
 * raise `OriginError` with `OBJECT_NOT_FOUND`, `OBJECT_CHANGED`, `ORIGIN_TIMEOUT` or
 * `ORIGIN_UNAVAILABLE`.
 */
export interface Origin {
  /** The configured name, as in `/v1/objects/{origin}/...`. */
  readonly name: string;
  /**
   * Size and version of an object.
   * @throws {OriginError} `OBJECT_NOT_FOUND` when there is no such object
   */
  stat(key: string, signal?: AbortSignal): Promise<ObjectInfo>;
  /**
   * Fills `dest` with the object's bytes from `offset` on (positional read, never the whole object).
   * @throws {OriginError} `OBJECT_CHANGED` when the object is no longer at `info.version`
   */
  read(key: string, info: ObjectInfo, offset: number, dest: Uint8Array, signal?: AbortSignal): Promise<void>;
  /** Objects whose key starts with `prefix`, in key order, at most `limit` of them. */
  list(prefix: string, limit: number): Promise<ListedObject[]>;
  /** Retry and hedge counters, for origins that retry by themselves. */
  requestStats?(): OriginRequestStats;
  /**
   * Registers who learns each successful read's time to first byte and total time (remote
   * origins, whose part size adapts to them; see `PartSizer`).
   */
  observeReads?(observer: (t: ReadTiming) => void): void;
  /** Registers who learns of each throttled attempt (S3 503 SlowDown, 429): the gateway halves its concurrency. */
  observeThrottling?(observer: () => void): void;
  /** Releases connections and handles. */
  close(): Promise<void>;
}

/**
 * The slowest an origin may deliver a read's bytes (see `readDeadlineMs`). Far below any working
 * S3 connection or file system (tens of MB/s and more), so only a broken one meets it.
 */
export const MIN_ORIGIN_BYTES_PER_S = 256 * 1024;

/**
 * How long a read of `bytes` may take in all (ms): the origin timeout, plus the bytes at
 * `MIN_ORIGIN_BYTES_PER_S`. Past it the read is given up, however steadily bytes trickle in.
 */
export function readDeadlineMs(timeoutMs: number, bytes: number): number {
  return timeoutMs + Math.ceil((bytes * 1000) / MIN_ORIGIN_BYTES_PER_S);
}
