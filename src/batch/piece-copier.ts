/**
 * @module How a batch's pieces are copied out of cached blocks: rackfeed's native gather
 * (`native/gather.c`, memcpy through the runtime's FFI) where the runtime can load it. A
 * JavaScript loop pays a typed-array view and a runtime call per piece: about half of memcpy's
 * speed on token pieces of a few KiB (bench/RESULTS.md, transport "Session 13", datasets 1i).
 */

/** Numbers per piece of a copy list: source address, bytes, offset in the destination. */
export const PIECE_NUMBERS = 3;

/** Copies a list of pieces with memcpy; the runtime's binding of `native/gather.c`. */
export interface PieceCopier {
  /**
   * The address of a buffer's first byte. Only for buffers whose memory never moves while they
   * live: cached blocks, batch bodies, ring slots (V8 never moves an ArrayBuffer's backing store;
   * a typed array of a few bytes held inside the heap is moved out by asking for its `.buffer`).
   */
  address(bytes: Uint8Array): number;
  /** Copies pieces `[first, end)` of `pieces` into `dst` on this thread; returns the bytes copied. */
  copy(dst: Uint8Array, pieces: Float64Array, first: number, end: number): number;
  /**
   * The same on a thread of the runtime's pool. `dst`, `pieces` and every source must stay alive
   * and unchanged until it settles (the caller holds them).
   */
  copyOnThread(dst: Uint8Array, pieces: Float64Array, first: number, end: number): Promise<number>;
  /** Threads a large batch's copy may be spread over (the machine's cores, at most 8; on Node, at most libuv's pool). */
  readonly threads: number;
}

/** A large batch is cut into slices of at least this many bytes, each copied on its own thread. */
export const SLICE_BYTES = 256 * 1024;

const addresses = new WeakMap<Uint8Array, number>();

/**
 * The address of a cached block, looked up once per block: blocks are the same objects for as
 * long as the memory tier holds them, and a batch touches the same few blocks again and again.
 */
export function blockAddress(copier: PieceCopier, block: Uint8Array): number {
  let a = addresses.get(block);
  if (a === undefined) {
    void block.buffer; // a small typed array's bytes move out of the heap, where they stay put
    a = copier.address(block);
    addresses.set(block, a);
  }
  return a;
}

/** The copier with the thread count `--native-gather-threads` sets (0: auto, the binding's own). */
export function withThreads(copier: PieceCopier | undefined, threads: number): PieceCopier | undefined {
  return copier === undefined || threads === 0 ? copier : { ...copier, threads };
}
