/** @module Typed errors raised where a problem is found; `http/error-handler.ts` maps their codes to HTTP statuses. */

const BRAND = Symbol.for("rackfeed.error");

/** Every error code rackfeed raises on purpose. The HTTP mapping lives in `http/error-handler.ts` only. */
export type ErrorCode =
  | "BAD_REQUEST"
  | "PAYLOAD_TOO_LARGE"
  | "REQUEST_TIMEOUT"
  | "UNAUTHORIZED"
  | "FORBIDDEN"
  | "NOT_FOUND"
  | "METHOD_NOT_ALLOWED"
  | "CONFLICT"
  | "ORIGIN_NOT_FOUND"
  | "OBJECT_NOT_FOUND"
  | "OBJECT_CHANGED"
  | "RANGE_NOT_SATISFIABLE"
  | "ORIGIN_UNAVAILABLE"
  | "ORIGIN_TIMEOUT"
  | "OVERLOADED"
  | "SHUTTING_DOWN"
  | "SHM_FULL"
  | "DATASET_REPLACED";

/**
 * Base class of rackfeed's errors. Branded with `Symbol.for("rackfeed.error")` so that
 * `isCacheServerError()` works across duplicated module copies, where `instanceof` would not.
 *
 * @example
 * ```ts
 * throw new CacheServerError("BAD_REQUEST", 'Cannot parse "count": expected an integer, received "x"');
 * ```
 */
export class CacheServerError extends Error {
  /** The machine-readable reason; decides the HTTP status. */
  readonly code: ErrorCode;
  /** Extra response headers the error implies (e.g. `Content-Range` for a 416). */
  readonly headers: Readonly<Record<string, string>>;

  /**
   * @param code the reason
   * @param message a sentence that names the bad value and what was expected
   * @param options `cause` (chained error) and `headers` (extra response headers)
   */
  constructor(
    code: ErrorCode,
    message: string,
    options: { cause?: unknown; headers?: Record<string, string> } = {},
  ) {
    super(message, { cause: options.cause });
    this.name = new.target.name;
    this.code = code;
    this.headers = options.headers ?? {};
    Object.defineProperty(this, BRAND, { value: true });
  }
}

/** An origin (filesystem, S3) failed, timed out, or said the object is missing or changed. */
export class OriginError extends CacheServerError {
  /**
   * Whether the failure says the origin itself cannot be reached (no answer in time, connections
   * refused, server errors after retries), rather than something about this one request (a
   * forbidden key, a name too long): only the former count towards judging the origin down.
   */
  readonly unreachable: boolean;

  /**
   * @param code the reason
   * @param message a sentence that names the origin, the object and what went wrong
   * @param options as `CacheServerError`'s, and `unreachable` (default false)
   */
  constructor(code: ErrorCode, message: string, options: { cause?: unknown; headers?: Record<string, string>; unreachable?: boolean } = {}) {
    super(code, message, options);
    this.unreachable = options.unreachable ?? false;
  }
}

/** A byte range, sample or step lies outside what exists. */
export class RangeNotSatisfiableError extends CacheServerError {
  /**
   * @param message what was asked and what exists
   * @param size the representation's length, echoed in `Content-Range: bytes *\/size` when known
   */
  constructor(message: string, size?: number) {
    super("RANGE_NOT_SATISFIABLE", message, {
      headers: size === undefined ? {} : { "content-range": `bytes */${size}` },
    });
  }
}

/** A bounded queue is full; the client should retry after a short pause. */
export class OverloadedError extends CacheServerError {
  /** @param message what was full */
  constructor(message: string) {
    super("OVERLOADED", message, { headers: { "retry-after": "1" } });
  }
}

/** The server is draining for shutdown and takes no new work. */
export class ShuttingDownError extends CacheServerError {
  /** @param message what was refused */
  constructor(message = "Server is shutting down") {
    super("SHUTTING_DOWN", message, { headers: { "retry-after": "1" } });
  }
}

/**
 * True when `e` is a rackfeed error, even one created by another copy of this module.
 *
 * @example
 * ```ts
 * if (isCacheServerError(err) && err.code === "OBJECT_CHANGED") retry();
 * ```
 */
export function isCacheServerError(e: unknown): e is CacheServerError {
  return typeof e === "object" && e !== null && (e as Record<symbol, unknown>)[BRAND] === true;
}

/** A request body over its route's bound (413); the message says the bound. */
export function payloadTooLarge(message: string): CacheServerError {
  return new CacheServerError("PAYLOAD_TOO_LARGE", message);
}

/** Shorthand for a 400 with a message that says what to fix. */
export function badRequest(message: string, cause?: unknown): CacheServerError {
  return new CacheServerError("BAD_REQUEST", message, { cause });
}
