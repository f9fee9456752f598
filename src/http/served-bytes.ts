/** @module Counts the body bytes actually handed to each transport. */

/** The transports of `rackfeed_served_bytes_total`. */
export type Transport = "http1" | "http2" | "shm";

/** Per-transport byte counters, shared by the routes that send bodies. */
export class ServedBytes {
  readonly #bytes: Record<Transport, number> = { http1: 0, http2: 0, shm: 0 };

  /** Adds `n` bytes sent over `transport`. */
  add(transport: Transport, n: number): void {
    this.#bytes[transport] += n;
  }

  /** A snapshot. */
  stats(): Readonly<Record<Transport, number>> {
    return { ...this.#bytes };
  }
}

/**
 * Wraps a chunk source as a pull-driven `ReadableStream`: the next chunk is produced only when
 * the runtime asks for it (its socket drained), which is the backpressure that keeps memory
 * flat for any length of body. Cancelling the stream (client gone) stops the source.
 *
 * @param source chunks to send, in order
 * @param onChunk called with each chunk's length as it is handed over
 * @returns the body stream
 */
export function pullStream(
  source: AsyncGenerator<Uint8Array, void, undefined>,
  onChunk: (n: number) => void,
): ReadableStream<Uint8Array> {
  let sent = 0;
  return new ReadableStream<Uint8Array>(
    {
      async pull(ctrl) {
        let r: IteratorResult<Uint8Array, void>;
        try {
          r = await source.next();
        } catch (e) {
          // The headers are out, so the body can only be cut. Both runtimes log the stream's error
          // with its stack and every cause (the AWS SDK's: ~40 lines per cut body): one line says it.
          ctrl.error(bodyCut(sent, e));
          return;
        }
        if (r.done) {
          ctrl.close();
          return;
        }
        sent += r.value.length;
        onChunk(r.value.length);
        ctrl.enqueue(r.value);
      },
      async cancel() {
        await source.return(undefined);
      },
    },
    { highWaterMark: 0 },
  );
}

/**
 * The HTTP version a request came in on, from the runtime's bindings: @hono/node-server passes
 * the Node request as `env.incoming`; on Deno the listener passes `{ httpVersion }` when known.
 */
export function httpTransport(env: unknown): "http1" | "http2" {
  const e = env as { incoming?: { httpVersionMajor?: number }; httpVersion?: string } | undefined;
  return e?.incoming?.httpVersionMajor === 2 || e?.httpVersion === "2" ? "http2" : "http1";
}

/** The error a cut body ends with: one line, naming how far it got and why. */
function bodyCut(sent: number, cause: unknown): Error {
  const why = cause instanceof Error ? cause.message : String(cause);
  const e = new Error(`rackfeed: response body cut after ${sent} bytes: ${why}`);
  e.stack = e.message; // what the runtimes print: this line alone
  return e;
}
