/** @module numpy's legacy `RandomState` (MT19937): integer seeding, raw outputs, masked bounded draws and `shuffle`, bit-exact. */

const N = 624;
const M = 397;
const MATRIX_A = 0x9908b0df;
const UPPER_MASK = 0x80000000;
const LOWER_MASK = 0x7fffffff;
const TWO_32 = 2 ** 32;

/** Anything `shuffle` can permute in place: typed arrays of numbers, or plain number arrays. */
export interface ShuffleTarget {
  readonly length: number;
  [index: number]: number;
}

/**
 * Smallest `2^k - 1` that is >= `max`, for `0 <= max <= 0xFFFFFFFF` (numpy's `gen_mask`).
 *
 * @param max the upper bound of a draw
 * @returns the mask as an unsigned 32-bit number
 */
function mask32(max: number): number {
  let m = max >>> 0;
  m |= m >>> 1;
  m |= m >>> 2;
  m |= m >>> 4;
  m |= m >>> 8;
  m |= m >>> 16;
  return m >>> 0;
}

/**
 * A numpy `numpy.random.RandomState(seed)` with an integer seed. Its output stream is frozen by
 * numpy's compatibility policy, which is what lets Megatron's shuffles be reproduced exactly.
 * Only the integer-seeded path (`init_genrand`) exists: Megatron always passes an `int`.
 *
 * @example
 * ```ts
 * const rs = new RandomState(1234);
 * const a = Int32Array.from([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
 * rs.shuffle(a); // [7, 2, 9, 1, 0, 8, 4, 5, 6, 3], as numpy gives
 * ```
 */
export class RandomState {
  #mt = new Uint32Array(N);
  #pos = N;

  /**
   * @param seed an integer in `0 … 2^32-1`, as numpy requires
   * @throws {RangeError} when the seed is not such an integer
   */
  constructor(seed: number) {
    if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) {
      throw new RangeError(`Cannot create RandomState: seed must be an integer in 0 … 4294967295, received ${seed}`);
    }
    const mt = this.#mt;
    mt[0] = seed;
    for (let k = 1; k < N; k++) {
      const prev = mt[k - 1];
      // Math.imul keeps the low 32 bits of the product, which a double multiply would lose.
      mt[k] = (Math.imul(1812433253, (prev ^ (prev >>> 30)) >>> 0) + k) >>> 0;
    }
    this.#pos = N;
  }

  /**
   * A copy of the generator state, as numpy's `get_state()` reports it (`key`, `pos`).
   *
   * @returns the 624 state words and the position of the next word to temper
   */
  getState(): { key: Uint32Array; pos: number } {
    return { key: this.#mt.slice(), pos: this.#pos };
  }

  #twist(): void {
    const mt = this.#mt;
    // In place and in increasing k: from k = 227 on, mt[k + 397 - 624] is already this pass's value.
    for (let k = 0; k < N; k++) {
      const y = (mt[k] & UPPER_MASK) | (mt[(k + 1) % N] & LOWER_MASK);
      let v = mt[(k + M) % N] ^ (y >>> 1);
      if (y & 1) v ^= MATRIX_A;
      mt[k] = v >>> 0;
    }
  }

  /**
   * The next tempered 32-bit output (`genrand_int32`).
   *
   * @returns an integer in `0 … 2^32-1`
   */
  nextUint32(): number {
    if (this.#pos === N) {
      this.#twist();
      this.#pos = 0;
    }
    let y = this.#mt[this.#pos++];
    y ^= y >>> 11;
    y ^= (y << 7) & 0x9d2c5680;
    y ^= (y << 15) & 0xefc60000;
    y ^= y >>> 18;
    return y >>> 0;
  }

  /**
   * A 64-bit output: the first 32-bit output is the high half, the second the low half.
   *
   * @returns an integer in `0 … 2^64-1`
   */
  nextUint64(): bigint {
    const hi = this.nextUint32();
    const lo = this.nextUint32();
    return (BigInt(hi) << 32n) | BigInt(lo);
  }

  /**
   * A uniform integer in `[0, max]` by masked rejection (numpy's `random_interval`): `max == 0`
   * consumes nothing, `max <= 2^32-1` consumes 32-bit outputs, larger `max` 64-bit ones.
   *
   * @param max inclusive upper bound, an integer in `0 … 2^53-1`
   * @returns the draw
   * @throws {RangeError} when `max` is negative, not an integer or above `2^53-1`
   */
  randomInterval(max: number): number {
    if (!Number.isSafeInteger(max) || max < 0) {
      throw new RangeError(`Cannot draw from [0, max]: max must be an integer in 0 … 2^53-1, received ${max}`);
    }
    if (max === 0) return 0;
    if (max <= 0xffffffff) {
      const mask = mask32(max);
      let v: number;
      do {
        v = (this.nextUint32() & mask) >>> 0;
      } while (v > max);
      return v;
    }
    // Above 32 bits the low word's mask is all ones, so only the high word needs masking;
    // hi stays below 2^21 and hi * 2^32 + lo is exact in a double.
    const hiMask = mask32(Math.floor(max / TWO_32));
    let v: number;
    do {
      const hi = (this.nextUint32() & hiMask) >>> 0;
      const lo = this.nextUint32();
      v = hi * TWO_32 + lo;
    } while (v > max);
    return v;
  }

  /**
   * numpy's legacy `randint(low, high)` for the default int64 dtype: a uniform integer in
   * `[low, high)`, or in `[0, low)` when `high` is omitted (masked rejection, as `randomInterval`).
   *
   * @param low inclusive lower bound (or exclusive upper bound when `high` is omitted)
   * @param high exclusive upper bound
   * @returns the draw
   * @throws {RangeError} when the range is empty or not made of safe integers
   */
  randint(low: number, high?: number): number {
    if (high === undefined) {
      high = low;
      low = 0;
    }
    if (!Number.isSafeInteger(low) || !Number.isSafeInteger(high) || high <= low) {
      throw new RangeError(`Cannot draw randint(${low}, ${high}): expected safe integers with low < high`);
    }
    return low + this.randomInterval(high - 1 - low);
  }

  /**
   * numpy's deprecated `random_integers(low, high)`: a uniform integer in `[low, high]`
   * (`[1, low]` when `high` is omitted); it is `randint(low, high + 1)`.
   *
   * @param low inclusive lower bound (or inclusive upper bound when `high` is omitted)
   * @param high inclusive upper bound
   * @returns the draw
   * @throws {RangeError} when `high < low`
   */
  randomIntegers(low: number, high?: number): number {
    if (high === undefined) {
      high = low;
      low = 1;
    }
    return this.randint(low, high + 1);
  }

  /**
   * Shuffles a 1-D array in place exactly as numpy's legacy `RandomState.shuffle`: for
   * `i = n-1` down to 1, swap `a[i]` with `a[randomInterval(i)]`. The stream continues
   * across calls.
   *
   * @param a the array to permute
   */
  shuffle(a: ShuffleTarget): void {
    let i = a.length - 1;
    // Arrays past 2^32 elements take the 64-bit branch for their top positions.
    for (; i > 0xffffffff; i--) {
      const j = this.randomInterval(i);
      const t = a[i];
      a[i] = a[j];
      a[j] = t;
    }
    if (i <= 0) return;
    // The generator is inlined: shuffles of tens of millions of elements are the index
    // build's hot loop, and a method call per draw costs as much as the draw.
    const mt = this.#mt;
    let pos = this.#pos;
    let mask = mask32(i);
    for (; i > 0; i--) {
      while (i <= mask >>> 1) mask >>>= 1;
      let j: number;
      do {
        if (pos === N) {
          this.#twist();
          pos = 0;
        }
        let y = mt[pos++];
        y ^= y >>> 11;
        y ^= (y << 7) & 0x9d2c5680;
        y ^= (y << 15) & 0xefc60000;
        y ^= y >>> 18;
        j = (y & mask) >>> 0;
      } while (j > i);
      const t = a[i];
      a[i] = a[j];
      a[j] = t;
    }
    this.#pos = pos;
  }

  /**
   * numpy's `permutation(n)`: `0 … n-1` shuffled.
   *
   * @param n the number of elements, at most `2^32`
   * @returns the permutation
   * @throws {RangeError} when `n` is not an integer in `0 … 2^32`
   */
  permutation(n: number): Uint32Array {
    if (!Number.isInteger(n) || n < 0 || n > TWO_32) {
      throw new RangeError(`Cannot build permutation(${n}): expected an integer in 0 … 2^32`);
    }
    const a = new Uint32Array(n);
    for (let k = 0; k < n; k++) a[k] = k;
    this.shuffle(a);
    return a;
  }
}
