/** @module Errors of the dataset layer: a malformed `.idx`/`.bin` pair, or a dataset configuration megatron-core would reject or hang on. */

import { CacheServerError } from "../errors.ts";

/**
 * An indexed dataset file is malformed or does not match its partner (bad magic, unknown
 * dtype, truncated, sequences that lie outside the `.bin`). A `BAD_REQUEST`, because it is
 * raised while registering a dataset that cannot be served.
 *
 * @example
 * ```ts
 * throw new DatasetFormatError("data/a.idx", "bad magic bytes 00 01 (expected 4d 4d 49 44 49 44 58 00 00)");
 * // message: Cannot read index "data/a.idx": bad magic bytes 00 01 (expected ...)
 * ```
 */
export class DatasetFormatError extends CacheServerError {
  /** The file the problem was found in, as the caller named it. */
  readonly file: string;

  /**
   * @param file the file's name or path, quoted in the message
   * @param problem what is wrong, starting lower-case (appended after `Cannot read index "file": `)
   * @param options `cause` (chained error)
   */
  constructor(file: string, problem: string, options: { cause?: unknown } = {}) {
    super("BAD_REQUEST", `Cannot read index "${file}": ${problem}`, options);
    this.file = file;
  }
}

/**
 * A dataset configuration is invalid, or describes a dataset megatron-core would refuse,
 * abort or loop forever on (section 7 of the spec). The message names the field.
 *
 * @example
 * ```ts
 * throw new DatasetConfigError("seq_length", "expected an integer >= 2, received 1");
 * // message: Invalid dataset config: seq_length: expected an integer >= 2, received 1
 * ```
 */
export class DatasetConfigError extends CacheServerError {
  /** The configuration field at fault, as a path such as `sources[1].weight`. */
  readonly field: string;

  /**
   * @param field the field at fault (JSON path in the registration body)
   * @param problem what was expected and what was received
   * @param options `cause` (chained error)
   */
  constructor(field: string, problem: string, options: { cause?: unknown } = {}) {
    super("BAD_REQUEST", `Invalid dataset config: ${field}: ${problem}`, options);
    this.field = field;
  }
}

/**
 * A registration whose indexes would take more memory than the server keeps for dataset indexes
 * (`--dataset-index-bytes`, every registered dataset and build in flight together). A
 * `BAD_REQUEST`: the same registration is refused until it asks for less (fewer samples or
 * sources, a shorter `seq_length`) or the bound is raised. The message gives the estimate, the
 * bound and what to change.
 *
 * @example
 * ```ts
 * throw new DatasetMemoryError('Cannot register dataset "pile": its indexes need ~5.2 GiB ...', 5.2 * 2 ** 30, 4 * 2 ** 30);
 * ```
 */
export class DatasetMemoryError extends CacheServerError {
  /** What the registration's build would take, in bytes. */
  readonly estimateBytes: number;
  /** What was left of the bound for it, in bytes. */
  readonly availableBytes: number;

  /**
   * @param message the whole message: the dataset, the estimate, the bound and what to change
   * @param estimateBytes what the build would take
   * @param availableBytes what was left of the bound for it
   */
  constructor(message: string, estimateBytes: number, availableBytes: number) {
    super("BAD_REQUEST", message);
    this.estimateBytes = estimateBytes;
    this.availableBytes = availableBytes;
  }
}
