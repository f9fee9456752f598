/**
 * @module The registered token datasets: each name maps to a Megatron `GPTDataset`/`BlendedDataset`
 * built from `.idx` files read through the block cache. An index is parsed once per version of
 * its files and kept; a changed `.idx` or `.bin` makes the next request rebuild it.
 */

import { setImmediate } from "node:timers";
import type { BlockCache } from "../cache/block-cache.ts";
import {
  buildFromIndexFiles,
  DatasetConfigError,
  type DatasetConfig,
  DTYPE_CODES,
  type IndexBuildInput,
  parseDatasetConfig,
  readIndexHeader,
  splitBookends,
  type TokenDataset,
} from "../dataset/mod.ts";
import { CacheServerError } from "../errors.ts";
import { validateObjectKey } from "../origin/object-key.ts";
import type { ObjectInfo } from "../origin/origin.ts";
import { ConcurrencyLimiter } from "../origin/limiter.ts";
import type { OriginGateway } from "../origin/origin-gateway.ts";

/** Where one source's files live. */
export interface SourceFiles {
  readonly gw: OriginGateway;
  readonly binKey: string;
  readonly idxKey: string;
  /** The `.bin` version the dataset was built from; batches read exactly this version. */
  readonly bin: ObjectInfo;
  readonly idx: ObjectInfo;
}

/** A dataset ready to serve. */
export interface RegisteredDataset {
  readonly name: string;
  readonly config: DatasetConfig;
  readonly dataset: TokenDataset;
  readonly files: readonly SourceFiles[];
  /** Seconds spent reading and building the indexes. */
  readonly buildSeconds: number;
}

/** Options of `DatasetCatalog`. */
export interface DatasetCatalogOptions {
  readonly origins: ReadonlyMap<string, OriginGateway>;
  readonly cache: BlockCache;
  /** Most datasets registered at once. */
  readonly maxDatasets: number;
  /** Largest `.idx` accepted, in bytes (it is held in memory). */
  readonly maxIndexBytes: number;
  readonly now: () => number;
  /** How often (ms) a dataset's files are checked for a new version, off the request path. */
  readonly recheckMs: number;
  /** Where a failed rebuild is reported (once per new error). */
  readonly log?: (message: string, err?: unknown) => void;
  /**
   * Builds a large dataset's indexes off the event loop (a worker thread); unset: every dataset
   * is built on the calling thread.
   */
  readonly buildOffThread?: (input: IndexBuildInput, signal?: AbortSignal) => Promise<TokenDataset>;
  /** Whether datasets built off the event loop keep their index arrays in shared memory (a planning thread reads them). */
  readonly shareIndexes?: boolean;
  /**
   * Told when a registered dataset is replaced by a new version (a registration, or its files
   * changed): whatever holds the old version for later use lets go of it, or its indexes (up to
   * gigabytes) stay alive for as long as that holder does.
   */
  readonly onReplaced?: (old: RegisteredDataset) => void;
}

/**
 * Datasets up to this much work are built on the event loop (~10 ms at most here); larger ones
 * go to `buildOffThread`, whose thread costs 0.1–0.5 s to start. Work as `buildWork` counts it
 * (a 95 MiB `.idx` and 2.4 M samples took 0.9 s here).
 */
export const INLINE_BUILD_MAX = 1 << 20;

/**
 * A build's work, in bytes it reads or fills: the `.idx` files, 16 per sample asked for, and 8
 * per entry of each source's document index, one entry per document and epoch. Epochs are
 * counted from the tokens of the source's `.bin` in the split (at most all samples from each
 * source): a small corpus read for many epochs (a long `seq_length`) has a document index far
 * larger than its `.idx` (60 000 samples of 2 M tokens over the demo files: 10 s of building).
 */
export function buildWork(input: IndexBuildInput): number {
  const { config } = input;
  const b = splitBookends(config.split);
  const share = b[config.split_index + 1] - b[config.split_index];
  let work = 16 * config.num_samples;
  input.idx.forEach((idx, k) => {
    work += idx.length;
    let header;
    try {
      header = readIndexHeader(idx, input.paths[k]);
    } catch {
      return; // refused by the build, naming the file
    }
    const documents = Math.max(1, header.boundaryCount - 1);
    const tokens = (share * input.binSizes[k]) / DTYPE_CODES[header.dtypeCode].itemSize;
    const epochs = Math.ceil((config.num_samples * config.seq_length) / Math.max(1, tokens));
    work += 8 * documents * epochs * share;
  });
  return work;
}
/** Longest stretch (ms) an `.idx` is copied for before other work gets the event loop. */
const READ_SLICE_MS = 5;

/** Dataset builds on worker threads at once; more wait (64 at most, then 503). */
const OFF_THREAD_BUILDS = 2;

function superseded(name: string): CacheServerError {
  return new CacheServerError("CONFLICT", `Registration of dataset "${name}" was superseded by a later one, which is served; send it again to replace that`);
}

/** After failed rebuilds, the version check backs off (doubling from `recheckMs`) up to this (ms). */
const MAX_RECHECK_MS = 60_000;

const NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$/;

/**
 * The datasets a server knows, by name.
 *
 * @example
 * ```ts
 * const catalog = new DatasetCatalog({ origins, cache, maxDatasets: 64, maxIndexBytes: 2 ** 30, now });
 * await catalog.register("pile", { sources: [{ prefix: "data/pile_text_document" }], seq_length: 4096, ... });
 * const { dataset } = await catalog.get("pile");
 * ```
 */
export class DatasetCatalog {
  readonly #opts: DatasetCatalogOptions;
  readonly #datasets = new Map<string, RegisteredDataset>();
  /** Version checks in flight (one per dataset), and when each dataset was last checked. */
  readonly #checks = new Map<string, Promise<void>>();
  readonly #checkedAt = new Map<string, number>();
  /** Datasets whose files changed and whose rebuild failed: the error, and failures in a row. */
  readonly #rebuildErrors = new Map<string, { message: string; failures: number }>();
  readonly #builds = { eventLoop: 0, worker: 0 };
  /** Registration order: each `register` call takes the next ticket; a name keeps the ticket of the registration it serves. */
  #tickets = 0;
  /** Registrations being built, by name: a later one of the same name stops the earlier. */
  readonly #inFlight = new Map<string, AbortController>();
  readonly #offThreadSlots = new ConcurrencyLimiter({ concurrency: OFF_THREAD_BUILDS, maxQueue: 64, what: "dataset index builds" });
  readonly #appliedTicket = new Map<string, number>();

  /** @param opts origins, cache and bounds */
  constructor(opts: DatasetCatalogOptions) {
    this.#opts = opts;
  }

  /** Names of the registered datasets. */
  names(): string[] {
    return [...this.#datasets.keys()];
  }

  /**
   * Validates a registration, reads every source's `.idx` and builds the dataset; replaces a
   * dataset of the same name only once the new one is built.
   *
   * @param name the dataset's name
   * @param body the registration (the JSON of `PUT /v1/datasets/{name}`)
   * @returns the dataset
   * @throws {CacheServerError} `BAD_REQUEST` naming the field or file at fault
   */
  async register(name: string, body: unknown): Promise<RegisteredDataset> {
    if (!NAME.test(name)) {
      throw new CacheServerError(
        "BAD_REQUEST",
        `Invalid dataset name "${name}": expected 1-128 letters, digits, "_", "." or "-", starting with a letter or digit`,
      );
    }
    if (!this.#datasets.has(name) && this.#datasets.size >= this.#opts.maxDatasets) {
      throw new CacheServerError(
        "BAD_REQUEST",
        `Cannot register dataset "${name}": ${this.#opts.maxDatasets} datasets are registered already (the limit)`,
      );
    }
    const config = parseDatasetConfig(body);
    // Registrations of one name apply in the order they arrived, whatever order their builds end in.
    const ticket = ++this.#tickets;
    // A registration in flight for this name will be overtaken by this one: its build (seconds on
    // a worker, for a large dataset) stops now, and its request gets its 409 at once.
    this.#inFlight.get(name)?.abort(superseded(name));
    const ac = new AbortController();
    this.#inFlight.set(name, ac);
    let built: RegisteredDataset;
    try {
      built = await this.#build(name, config, ac.signal);
    } finally {
      if (this.#inFlight.get(name) === ac) this.#inFlight.delete(name);
    }
    if ((this.#appliedTicket.get(name) ?? 0) > ticket) {
      throw superseded(name);
    }
    if (!this.#datasets.has(name) && this.#datasets.size >= this.#opts.maxDatasets) {
      // Checked again: other names may have been registered while this one was built.
      throw new CacheServerError("BAD_REQUEST", `Cannot register dataset "${name}": ${this.#opts.maxDatasets} datasets are registered already (the limit)`);
    }
    this.#appliedTicket.set(name, ticket);
    const old = this.#datasets.get(name);
    this.#datasets.set(name, built);
    if (old !== undefined) this.#opts.onReplaced?.(old);
    this.#checkedAt.set(name, this.#opts.now());
    this.#rebuildErrors.delete(name);
    return built;
  }

  /**
   * Why the dataset still serves the version built before, when its files changed and the
   * rebuild failed (a malformed new `.idx`, a file missing); undefined otherwise.
   */
  rebuildError(name: string): string | undefined {
    return this.#rebuildErrors.get(name)?.message;
  }

  /**
   * The dataset `name`. Its files are checked for a new version at most every `recheckMs`, in
   * the background: a batch never waits for a stat behind the origin's queue. Until a rebuilt
   * dataset replaces it, the old version is served; its block reads name the old version, so an
   * origin that has changed fails them loudly (never mixes versions).
   *
   * @throws {CacheServerError} `NOT_FOUND` for an unknown name
   */
  get(name: string): Promise<RegisteredDataset> {
    const ds = this.#datasets.get(name);
    if (!ds) {
      return Promise.reject(
        new CacheServerError("NOT_FOUND", `Unknown dataset "${name}"; registered: ${this.names().join(", ") || "(none)"}`),
      );
    }
    const now = this.#opts.now();
    // A failed rebuild is tried again, less often each time: it re-reads every .idx.
    const failures = this.#rebuildErrors.get(name)?.failures ?? 0;
    const every = Math.min(MAX_RECHECK_MS, this.#opts.recheckMs * 2 ** failures);
    if (!this.#checks.has(name) && now - (this.#checkedAt.get(name) ?? 0) >= every) {
      this.#checkedAt.set(name, now);
      const check = this.#recheck(name, ds).then(
        () => void this.#rebuildErrors.delete(name),
        (e) => this.#rebuildFailed(name, e),
      ).finally(() => this.#checks.delete(name));
      this.#checks.set(name, check);
    }
    return Promise.resolve(ds);
  }

  /** Dataset builds (registrations and rebuilds) so far, by where they ran. */
  builds(): { readonly eventLoop: number; readonly worker: number } {
    return { ...this.#builds };
  }

  /** Waits for version checks in flight (tests, shutdown). */
  async settled(): Promise<void> {
    await Promise.all([...this.#checks.values()]);
  }

  #rebuildFailed(name: string, e: unknown): void {
    const message = e instanceof Error ? e.message : String(e);
    const last = this.#rebuildErrors.get(name);
    this.#rebuildErrors.set(name, { message, failures: (last?.failures ?? 0) + 1 });
    if (last?.message !== message) {
      this.#opts.log?.(`rackfeed: dataset "${name}": its files changed and the rebuild failed; batches not in memory fail until it succeeds (retried, backing off to ${MAX_RECHECK_MS / 1000} s): ${message}`);
    }
  }

  async #recheck(name: string, ds: RegisteredDataset): Promise<void> {
    let changed = false;
    for (const f of ds.files) {
      const [bin, idx] = await Promise.all([f.gw.stat(f.binKey), f.gw.stat(f.idxKey)]);
      if (bin.version !== f.bin.version || idx.version !== f.idx.version) changed = true;
    }
    if (!changed) return;
    const next = await this.#build(name, ds.config);
    if (this.#datasets.get(name) === ds) {
      this.#datasets.set(name, next);
      this.#opts.onReplaced?.(ds);
    }
  }

  async #build(name: string, config: DatasetConfig, signal?: AbortSignal): Promise<RegisteredDataset> {
    const t0 = this.#opts.now();
    const files = await Promise.all(config.sources.map((s, k) => this.#locate(s.prefix, k)));
    const input: IndexBuildInput = {
      config,
      idx: await Promise.all(files.map((f) => this.#readWhole(f.gw, f.idxKey, f.idx))),
      paths: files.map((f) => `${f.gw.name}/${f.idxKey}`),
      binSizes: files.map((f) => f.bin.size),
      shareArrays: this.#opts.shareIndexes === true,
    };
    const offThread = buildWork(input) > INLINE_BUILD_MAX ? this.#opts.buildOffThread : undefined;
    this.#builds[offThread ? "worker" : "eventLoop"]++;
    signal?.throwIfAborted();
    // At most OFF_THREAD_BUILDS at once: each holds its .idx and its arrays (~240 MiB for 10 G tokens).
    const dataset = offThread
      ? await this.#offThreadSlots.run(() => offThread(input, signal), { signal })
      : buildFromIndexFiles(input);
    // Files replaced while we read them would pair an index with the wrong tokens: check that
    // both versions held for the whole build (the stat cache may answer; the block reads that
    // follow re-check the .bin version on every read anyway).
    for (const f of files) {
      f.gw.invalidate(f.binKey);
      f.gw.invalidate(f.idxKey);
      const [bin, idx] = await Promise.all([f.gw.stat(f.binKey), f.gw.stat(f.idxKey)]);
      if (bin.version !== f.bin.version || idx.version !== f.idx.version) {
        throw new CacheServerError(
          "OBJECT_CHANGED",
          `Dataset "${name}": ${f.gw.name}/${f.idxKey} or its .bin changed while the index was built; retry`,
        );
      }
    }
    return Object.freeze({ name, config, dataset, files, buildSeconds: (this.#opts.now() - t0) / 1000 });
  }

  async #locate(prefix: string, k: number): Promise<SourceFiles> {
    const field = `sources[${k}].prefix`;
    const slash = prefix.indexOf("/");
    if (slash <= 0) {
      throw new DatasetConfigError(field, `expected "{origin}/path/prefix", received "${prefix}"`);
    }
    const originName = prefix.slice(0, slash);
    const gw = this.#opts.origins.get(originName);
    if (!gw) {
      throw new DatasetConfigError(
        field,
        `unknown origin "${originName}"; configured origins: ${[...this.#opts.origins.keys()].join(", ") || "(none)"}`,
      );
    }
    const path = prefix.slice(slash + 1);
    let binKey: string;
    let idxKey: string;
    try {
      binKey = validateObjectKey(`${path}.bin`);
      idxKey = validateObjectKey(`${path}.idx`);
    } catch (e) {
      throw new DatasetConfigError(field, (e as Error).message);
    }
    const stat = (key: string) =>
      gw.stat(key).catch((e) => {
        if (e instanceof CacheServerError && e.code === "OBJECT_NOT_FOUND") {
          throw new DatasetConfigError(field, `"${originName}/${key}" does not exist`);
        }
        throw e;
      });
    // Both asked at once; a failure is reported in a fixed order (.bin first), not whichever came back first.
    const settled = await Promise.allSettled([stat(binKey), stat(idxKey)]);
    for (const r of settled) if (r.status === "rejected") throw r.reason;
    const [bin, idx] = settled.map((r) => (r as PromiseFulfilledResult<ObjectInfo>).value);
    if (idx.size > this.#opts.maxIndexBytes) {
      throw new DatasetConfigError(
        field,
        `"${originName}/${idxKey}" is ${idx.size} bytes, more than the ${this.#opts.maxIndexBytes}-byte limit for an index`,
      );
    }
    return { gw, binKey, idxKey, bin, idx };
  }

  async #readWhole(gw: OriginGateway, key: string, info: ObjectInfo): Promise<Uint8Array> {
    const out = new Uint8Array(info.size);
    let at = 0;
    let sliceStart = this.#opts.now();
    for await (const chunk of this.#opts.cache.readRange(gw, key, info, 0, info.size)) {
      out.set(chunk, at);
      at += chunk.length;
      // Cached blocks come as promises already settled, and a for-await over those runs as one
      // task: copying a 95 MiB .idx (into fresh pages) held every batch for ~80 ms. Other work
      // gets the event loop between slices.
      if (this.#opts.now() - sliceStart > READ_SLICE_MS) {
        await new Promise<void>((r) => setImmediate(r));
        sliceStart = this.#opts.now();
      }
    }
    return out;
  }
}
