/**
 * @module The shared-memory fast path, server side: a Unix-socket control channel and, per
 * consumer (one per connection), a ring of slots in a file under `--shm-dir`. The server fills
 * slots ahead of the consumer, one batch per slot, in step order; a slot is reused only after
 * the client releases it (backpressure, never a dropped batch). A closed connection, whatever
 * the cause (kill -9 included: the kernel closes the socket), takes its ring's name away at once;
 * the ring is then removed, or kept for the next consumer of its layout when its client closed
 * the connection having released every slot.
 */

import * as fs from "node:fs";
import * as net from "node:net";
import type { BatchStats } from "../batch/batch-stats.ts";
import type { PieceCopier } from "../batch/piece-copier.ts";
import type { DatasetCatalog, RegisteredDataset } from "../batch/dataset-catalog.ts";
import type { ReadAhead } from "../batch/read-ahead.ts";
import type { BlockCache } from "../cache/block-cache.ts";
import type { ServedBytes } from "../http/served-bytes.ts";
import { type MapFile, releaseRingOwnerLock, removeDeadRings, takeRingOwnerLock } from "./ring-file.ts";
import { makeDirs } from "../runtime/make-dirs.ts";
import { RingPool } from "./ring-pool.ts";
import { ShmConnection } from "./shm-connection.ts";
import type { FileLock, LockFile } from "../cache/cache-dir-lock.ts";

/** Connections on the control socket at once; more are accepted and closed at once. */
const MAX_CONNECTIONS = 1024;

/** The Unix credentials of a local peer (SO_PEERCRED). */
export interface PeerCredentials {
  readonly pid: number;
  readonly uid: number;
  readonly gid: number;
}

/** How the runtime reads a connected peer's credentials, and the user this server runs as. */
export interface PeerIdentity {
  readonly of: (socket: net.Socket) => PeerCredentials | undefined;
  readonly uid: number;
}

/** What the shm server needs: the batch path's parts, its limits, and the runtime's process facts. */
export interface ShmServerOptions {
  readonly socketPath: string;
  /** How long a connection may go without asking for a consumer (`open`), in ms (default 30 s; tests shorten it). */
  readonly openTimeoutMs?: number;
  /**
   * Rings of ended consumers kept for the next consumer of the same ring size (their pages
   * allocated, their mapping made; `--shm-spare-rings`, default 0 here). A new ring's pages and
   * mapping cost ~3 ms of the event loop per consumer here, most of it full collections (V8
   * counts each mapping as external memory); a trainer's next epoch, another rank, or a
   * benchmark's next pass starts on a kept ring instead.
   */
  readonly spareRings?: number;
  /** How long an ended consumer's ring is kept for the next consumer, in ms (default `SPARE_RING_MS`; tests shorten it). */
  readonly spareRingMs?: number;
  readonly dir: string;
  readonly catalog: DatasetCatalog;
  readonly cache: BlockCache;
  readonly readAhead: ReadAhead;
  readonly served: ServedBytes;
  readonly stats: BatchStats;
  readonly onBatch: (seconds: number, cache: "hit" | "filling" | "miss") => void;
  /**
   * A step's timings from a `timings` message, as `POST /v1/telemetry` hands them to the metrics
   * (the dataset is the connection's). Unset: `welcome` does not offer `timings`, and clients
   * report over HTTP.
   */
  readonly onTimings?: (dataset: string, timings: { t_wait?: number; t_h2d?: number; t_compute?: number }) => void;
  readonly maxBatchBytes: number;
  /** Default ring size when the client names none. */
  readonly slots: number;
  /** Bytes of all ring files together. */
  readonly budgetBytes: number;
  readonly readToken: string | undefined;
  /** Random id of this server instance; `GET /v1/shm` tells it too, so a client knows the socket leads to the same server. */
  readonly instance: string;
  readonly pid: number;
  readonly isAlive: (pid: number) => boolean;
  /**
   * The runtime's `flock`: the server holds a lock file beside its rings while it runs, and
   * another server's rings count as dead only once their lock can be taken (whatever their pid,
   * which a server in another pid namespace cannot see). Without it, liveness goes by pid.
   */
  readonly lockFile?: LockFile;
  readonly mapFile: MapFile | undefined;
  /** The native gather; unset: batches are copied in JavaScript. */
  readonly copier?: PieceCopier;
  /**
   * Where the runtime can read a peer's Unix credentials: a peer running as this server's user
   * (or root) is admitted without the read token. Elsewhere every peer must send the token.
   */
  readonly peers?: PeerIdentity;
  readonly now: () => number;
  readonly log: (message: string, err?: unknown) => void;
}

/** What `/metrics` and the dashboard show of the shm path. */
export interface ShmStats {
  /** Rings of consumers now. */
  readonly rings: number;
  /** Bytes of every ring file, spare ones included (all count in `--shm-bytes`). */
  readonly ringBytes: number;
  /** Rings of ended consumers kept for the next one. */
  readonly spareRings: number;
  readonly connections: number;
}

/** A listening shm control socket. */
export class ShmServer {
  readonly #opts: ShmServerOptions;
  readonly #server: net.Server;
  readonly #conns = new Set<ShmConnection>();
  readonly #pool: RingPool;
  /** This server's ring lock (`ringOwnerLockPath`), held while it runs where the runtime has flock. */
  #ownerLock: FileLock | undefined;

  private constructor(opts: ShmServerOptions) {
    this.#opts = opts;
    this.#pool = new RingPool({
      dir: opts.dir,
      pid: opts.pid,
      instance: opts.instance,
      budgetBytes: opts.budgetBytes,
      spareRings: opts.spareRings ?? 0,
      spareRingMs: opts.spareRingMs,
      now: opts.now,
      log: opts.log,
    });
    this.#server = net.createServer((socket) => {
      if (this.#conns.size >= MAX_CONNECTIONS) {
        socket.destroy();
        return;
      }
      const c = new ShmConnection(socket, this.#pool, opts);
      this.#conns.add(c);
      socket.once("close", () => this.#conns.delete(c));
    });
  }

  /**
   * Removes rings left by dead servers, takes the socket path (removing a stale socket whose
   * server is gone, refusing one that still answers), and listens.
   *
   * @throws {Error} when another live server holds the socket path, or the directory is unusable
   */
  static async start(opts: ShmServerOptions): Promise<ShmServer> {
    await makeDirs(opts.dir);
    const ownerLock = opts.lockFile ? await takeRingOwnerLock(opts.dir, opts.pid, opts.instance, opts.lockFile) : undefined;
    try {
      return await ShmServer.#listen(opts, ownerLock);
    } catch (e) {
      if (opts.lockFile) await releaseRingOwnerLock(opts.dir, opts.pid, opts.instance, ownerLock);
      throw e;
    }
  }

  static async #listen(opts: ShmServerOptions, ownerLock: FileLock | undefined): Promise<ShmServer> {
    const removed = await removeDeadRings(opts.dir, opts.isAlive, { pid: opts.pid, instance: opts.instance }, opts.lockFile, opts.log);
    if (removed.length) opts.log(`rackfeed: removed ${removed.length} ring file(s) of dead servers from ${opts.dir}`);
    const existing = fs.lstatSync(opts.socketPath, { throwIfNoEntry: false });
    if (existing) {
      if (!existing.isSocket()) throw new Error(`${opts.socketPath} exists and is not a socket; remove it or pass another --shm-socket`);
      if (await answers(opts.socketPath)) {
        throw new Error(`Shared-memory socket ${opts.socketPath} is held by a running server; stop it or pass another --shm-socket`);
      }
      fs.rmSync(opts.socketPath, { force: true });
    }
    const s = new ShmServer(opts);
    s.#ownerLock = ownerLock;
    await new Promise<void>((resolve, reject) => {
      s.#server.once("error", reject);
      s.#server.listen(opts.socketPath, () => {
        s.#server.off("error", reject);
        // An accept failure (e.g. EMFILE) must not kill the process, HTTP included.
        s.#server.on("error", (e) => opts.log("rackfeed: shared-memory socket error", e));
        resolve();
      });
    });
    // Owner and group: only they may open the socket; then, with a read token set, a peer is
    // admitted by its Unix credentials (same user) where the runtime reads them, else by the token.
    fs.chmodSync(opts.socketPath, 0o660);
    return s;
  }

  /** The control socket's path. */
  get socketPath(): string {
    return this.#opts.socketPath;
  }

  /** Rings and connections now. */
  stats(): ShmStats {
    let rings = 0;
    for (const c of this.#conns) if (c.hasRing) rings++;
    return { rings, ringBytes: this.#pool.bytes, spareRings: this.#pool.spareCount, connections: this.#conns.size };
  }

  /** Ends the consumers whose rings are filled from `old`, a dataset version just replaced (see `ShmConnection.versionReplaced`). */
  versionReplaced(old: RegisteredDataset): void {
    for (const c of this.#conns) c.versionReplaced(old);
  }

  /** Stops listening, ends every connection (their rings are removed) and removes the socket. */
  async close(): Promise<void> {
    this.#pool.close();
    const closed = new Promise<void>((r) => this.#server.close(() => r()));
    const conns = [...this.#conns];
    await Promise.all(conns.map((c) => c.end()));
    // A ring being allocated stops between two writes and removes its file: wait for that, so no
    // ring file outlives the process (an exit follows shutdown at once).
    await Promise.all(conns.map((c) => c.opened()));
    await closed;
    fs.rmSync(this.#opts.socketPath, { force: true });
    if (this.#ownerLock) {
      await releaseRingOwnerLock(this.#opts.dir, this.#opts.pid, this.#opts.instance, this.#ownerLock);
      this.#ownerLock = undefined;
    }
  }
}

/** Whether something accepts connections on a Unix socket path. */
function answers(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(path);
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });
}
