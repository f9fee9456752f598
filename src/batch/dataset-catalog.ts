/**
 * @module The registered token datasets: each name maps to a Megatron `GPTDataset`/`BlendedDataset`
 * built from `.idx` files read through the block cache. An index is parsed once per version of
 * its files and kept; a changed `.idx` or `.bin` makes the next request rebuild it.
 */

import { setImmediate } from "node:timers";
import type { BlockCache } from "../cache/block-cache.ts";
import { formatBytes } from "../config/size.ts";
import {
  buildFromIndexFiles,
  DatasetConfigError,
  type DatasetConfig,
  DatasetMemoryError,
  DTYPE_CODES,
  estimateIndexMemory,
  type IndexBuildInput,
  indexMemoryLowerBound,
  type IndexMemoryEstimate,
  parseDatasetConfig,
  readIndexHeader,
  SAMPLE_BYTES,
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
  /**
   * Bytes of memory it counts against `datasetIndexBytes` while registered: its build's size as
   * estimated before the build (`estimateIndexMemory`: its indexes and the `.idx` files read).
   */
  readonly indexBytes: number;
}

/** What `DatasetCatalog.register` did. */
export interface Registration {
  /** The dataset now served under the name. */
  readonly registered: RegisteredDataset;
  /** Whether it replaced a dataset of the same name (false: the name is new). */
  readonly replaced: boolean;
}

/** Options of `DatasetCatalog`. */
export interface DatasetCatalogOptions {
  readonly origins: ReadonlyMap<string, OriginGateway>;
  readonly cache: BlockCache;
  /** Most datasets registered at once. */
  readonly maxDatasets: number;
  /** Largest `.idx` accepted, in bytes (it is held in memory). */
  readonly maxIndexBytes: number;
  /**
   * Memory, in bytes, the indexes of every registered dataset and every build in flight may take
   * together (see `estimateIndexMemory`); a registration or rebuild that would go beyond is refused
   * before it reads its `.idx` files, or at the latest before it builds.
   */
  readonly datasetIndexBytes: number;
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

/** Index memory set aside for one build in flight, in bytes (see `DatasetCatalog.#claim`). */
interface Claim {
  bytes: number;
}

/** The memory a build asks for, and how to say so if it is refused. */
interface MemoryNeed {
  readonly bytes: number;
  /** A lower bound (before the `.idx` files are read), not an estimate. */
  readonly atLeast: boolean;
  /** What the bytes are made of. */
  readonly what: () => string;
  /** What to change in the registration. */
  readonly advice: string;
}

/** What an estimate is made of, for the refusal's message. */
function describeEstimate(e: IndexMemoryEstimate, sharedCopy: boolean): string {
  const parts = [
    `${formatBytes(e.sampleBytes)} of sample and shuffle indexes (${e.samples} samples of whole epochs, ${SAMPLE_BYTES} bytes each)`,
    `${formatBytes(e.documentIndexBytes)} of document index (${e.documentEntries} entries, up to ${e.maxEpochs} epochs of a source's documents)`,
    `${formatBytes(e.parsedBytes)} of parsed .idx arrays`,
  ];
  if (e.blendBytes > 0) parts.push(`${formatBytes(e.blendBytes)} of blend indexes`);
  return `${parts.join(", ")}, ${formatBytes(e.heldBytes)} in all, and the ${formatBytes(e.idxBytes)} of .idx files read` +
    (sharedCopy ? `, and a copy of the arrays in shared memory for the planning thread` : "");
}

const SOURCES_ADVICE = "use fewer sources (each reads and parses its own .idx, even of the same file)";

/** What to change in a registration whose estimate is too large, its largest part first. */
function adviceFor(e: IndexMemoryEstimate): string {
  const largest = Math.max(e.sampleBytes, e.documentIndexBytes, e.parsedBytes + e.idxBytes, e.blendBytes);
  if (largest === e.documentIndexBytes) {
    return `ask for fewer num_samples or a shorter seq_length (the document index grows with the epochs of the corpus that num_samples × seq_length tokens take)`;
  }
  if (largest === e.parsedBytes + e.idxBytes) return SOURCES_ADVICE;
  return `ask for fewer num_samples`;
}

/**
 * The datasets a server knows, by name.
 *
 * @example
 * ```ts
 * const catalog = new DatasetCatalog({ origins, cache, maxDatasets: 64, maxIndexBytes: 2 ** 30, datasetIndexBytes: 2 ** 32, now });
 * const { replaced } = await catalog.register("pile", { sources: [{ prefix: "data/pile_text_document" }], seq_length: 4096, ... });
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
  /** Index memory set aside for the builds in flight (registrations and rebuilds), one claim each. */
  readonly #claims = new Set<Claim>();

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
   * @returns the dataset, and whether it replaced one of the same name (told at the moment it
   *   took the name, so of two registrations of a new name exactly one created it)
   * @throws {CacheServerError} `BAD_REQUEST` naming the field or file at fault
   * @throws {DatasetMemoryError} (`BAD_REQUEST`) when its indexes would take the memory of
   *   `datasetIndexBytes` beyond what the other datasets and builds hold
   */
  async register(name: string, body: unknown): Promise<Registration> {
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
    // Its index memory counts from the build's first allocation until the dataset is served (then
    // as its `indexBytes`) or dropped: given back in the same task as either, so no other
    // registration ever sees it counted twice or not at all.
    const claim: Claim = { bytes: 0 };
    try {
      let built: RegisteredDataset;
      try {
        built = await this.#build(name, config, claim, "register", ac.signal);
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
      // Whether this replaced a dataset is told here, where the name is taken, not before the
      // build: two registrations of a new name both saw it free when they started.
      const old = this.#datasets.get(name);
      this.#datasets.set(name, built);
      if (old !== undefined) this.#opts.onReplaced?.(old);
      this.#checkedAt.set(name, this.#opts.now());
      this.#rebuildErrors.delete(name);
      return { registered: built, replaced: old !== undefined };
    } finally {
      this.#claims.delete(claim);
    }
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
    // A rebuild counts against the bound like a registration, the old version's indexes included:
    // both are in memory until the new one replaces it. Refused, the old version goes on serving.
    const claim: Claim = { bytes: 0 };
    try {
      const next = await this.#build(name, ds.config, claim, "rebuild");
      if (this.#datasets.get(name) === ds) {
        this.#datasets.set(name, next);
        this.#opts.onReplaced?.(ds);
      }
    } finally {
      this.#claims.delete(claim);
    }
  }

  /**
   * Index memory of the registered datasets other than `name` and of the builds in flight other
   * than `except`. The version `name` replaces is left out: it goes once the new one is in, and
   * counted, a dataset over half the bound could never be rebuilt when a file changed, failing
   * its uncached batches (`OBJECT_CHANGED`) until a restart. The bound may be passed by that
   * version's size while the new one builds.
   */
  #indexBytesInUse(except: Claim, name: string): number {
    let bytes = 0;
    for (const [n, d] of this.#datasets) if (n !== name) bytes += d.indexBytes;
    for (const c of this.#claims) if (c !== except) bytes += c.bytes;
    return bytes;
  }

  /**
   * Sets `claim` to `need.bytes` of index memory, or refuses the build when that would take the
   * catalog's index memory (registered datasets and builds in flight) past `datasetIndexBytes`.
   *
   * @throws {DatasetMemoryError} naming the estimate, what is left of the bound and what to change
   */
  #claim(name: string, claim: Claim, action: "register" | "rebuild", need: MemoryNeed): void {
    const bound = this.#opts.datasetIndexBytes;
    const others = this.#indexBytesInUse(claim, name);
    if (others + need.bytes <= bound) {
      claim.bytes = need.bytes;
      this.#claims.add(claim);
      return;
    }
    const left = Math.max(0, bound - others);
    const building = [...this.#claims].some((c) => c !== claim && c.bytes > 0);
    const registered = this.#datasets.size - (this.#datasets.has(name) ? 1 : 0);
    const held = others === 0
      ? ""
      : ` (${formatBytes(others)} of it taken by ${registered === 0 ? "" : `the ${registered} ${this.#datasets.has(name) ? "other " : ""}dataset${registered === 1 ? "" : "s"} registered`}` +
        `${building ? `${registered === 0 ? "" : " and "}the builds in flight` : ""})`;
    throw new DatasetMemoryError(
      `Cannot ${action === "register" ? "register" : "rebuild (its files changed)"} dataset "${name}": its indexes need ${need.atLeast ? "at least " : "~"}` +
        `${formatBytes(need.bytes)} of memory (${need.bytes} bytes: ${need.what()}), more than the ${formatBytes(left)} left of ` +
        `--dataset-index-bytes ${formatBytes(bound)}${held}; ${need.advice}, or raise --dataset-index-bytes`,
      need.bytes,
      left,
    );
  }

  async #build(name: string, config: DatasetConfig, claim: Claim, action: "register" | "rebuild", signal?: AbortSignal): Promise<RegisteredDataset> {
    const t0 = this.#opts.now();
    const files = await Promise.all(config.sources.map((s, k) => this.#locate(s.prefix, k)));
    // Before any .idx is read (each up to --max-index-bytes, one read per source, even of the same
    // file): what the files and the sample indexes alone will take, a lower bound.
    const lowerBound = indexMemoryLowerBound(config, files.map((f) => f.idx.size));
    const idxBytes = files.reduce((a, f) => a + f.idx.size, 0);
    this.#claim(name, claim, action, {
      bytes: lowerBound,
      atLeast: true,
      what: () =>
        `its ${files.length} .idx file${files.length === 1 ? "" : "s"} (${formatBytes(idxBytes)}) and the sample ` +
        `and shuffle indexes of ${config.num_samples} samples (${SAMPLE_BYTES} bytes each) alone`,
      advice: idxBytes > lowerBound / 2 ? SOURCES_ADVICE : "ask for fewer num_samples",
    });
    const input: IndexBuildInput = {
      config,
      idx: await Promise.all(files.map((f) => this.#readWhole(f.gw, f.idxKey, f.idx))),
      paths: files.map((f) => `${f.gw.name}/${f.idxKey}`),
      binSizes: files.map((f) => f.bin.size),
      shareArrays: this.#opts.shareIndexes === true,
    };
    const estimate = estimateIndexMemory(input);
    const offThread = buildWork(input) > INLINE_BUILD_MAX ? this.#opts.buildOffThread : undefined;
    // With a planning thread the arrays go to shared memory: copied there by the worker at the end
    // of its build (both copies live for a moment), or, for a small dataset built here, once more
    // for the thread. A registered dataset keeps counting at its build's size, not only at what its
    // indexes keep: the memory a build frees (the files read, the worker's copies) can stay with
    // the process's allocator, not the system (measured with bin/rackfeed on Node: RSS after
    // registering 500 sources of one 641 KiB .idx stayed ~0.3 GiB above the 0.46 GiB they keep).
    const shared = this.#opts.shareIndexes === true;
    const indexBytes = estimate.buildBytes + (shared ? estimate.heldBytes : 0);
    signal?.throwIfAborted();
    this.#claim(name, claim, action, { bytes: indexBytes, atLeast: false, what: () => describeEstimate(estimate, shared), advice: adviceFor(estimate) });
    this.#builds[offThread ? "worker" : "eventLoop"]++;
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
    return Object.freeze({ name, config, dataset, files, buildSeconds: (this.#opts.now() - t0) / 1000, indexBytes });
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
