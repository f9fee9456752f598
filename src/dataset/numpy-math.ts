/** @module The few numpy/Python floating-point operations Megatron's index build depends on, reproduced bit for bit. */

/**
 * `numpy.sum` of a float64 array: numpy's pairwise summation (eight running sums per block of
 * up to 128 values, halves split at a multiple of 8 above that), which rounds differently from
 * a left-to-right sum once there are eight or more values.
 *
 * @param values the array to sum
 * @param start first index (default 0)
 * @param end one past the last index (default `values.length`)
 * @returns the sum, as numpy computes it
 * @example
 * ```ts
 * pairwiseSum([0.1, 0.2, 0.3]); // 0.6000000000000001
 * ```
 */
export function pairwiseSum(values: ArrayLike<number>, start = 0, end = values.length): number {
  const n = end - start;
  if (n < 8) {
    let res = 0;
    for (let i = start; i < end; i++) res += values[i];
    return res;
  }
  if (n <= 128) {
    const r = [0, 0, 0, 0, 0, 0, 0, 0];
    for (let j = 0; j < 8; j++) r[j] = values[start + j];
    let i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (let j = 0; j < 8; j++) r[j] += values[start + i + j];
    }
    let res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; i++) res += values[start + i];
    return res;
  }
  let n2 = Math.floor(n / 2);
  n2 -= n2 % 8;
  return pairwiseSum(values, start, start + n2) + pairwiseSum(values, start + n2, end);
}

/**
 * Megatron's `normalize(weights)`: each value divided by `numpy.sum` of all of them.
 *
 * @param values the raw weights
 * @returns a new array of the normalised weights
 * @example
 * ```ts
 * normalize([0.1, 0.2, 0.3]); // [0.16666666666666666, 0.3333333333333333, 0.4999999999999999]
 * ```
 */
export function normalize(values: ArrayLike<number>): Float64Array {
  const sum = pairwiseSum(values);
  const out = new Float64Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = values[i] / sum;
  return out;
}

/**
 * Python's `round(x)` for a double: the nearest integer, exact halves to the even neighbour.
 *
 * @param x a finite double
 * @returns the rounded value
 * @example
 * ```ts
 * roundHalfEven(2.5); // 2
 * roundHalfEven(49.5); // 50
 * ```
 */
export function roundHalfEven(x: number): number {
  const f = Math.floor(x);
  // x - floor(x) is exact for doubles, so the halfway test is exact too.
  const d = x - f;
  if (d < 0.5) return f;
  if (d > 0.5) return f + 1;
  return f % 2 === 0 ? f : f + 1;
}

/**
 * Floor division of non-negative safe integers, exact even where `a / b` rounds up to the
 * next integer in double precision.
 *
 * @param a dividend, a non-negative safe integer
 * @param b divisor, a positive safe integer
 * @returns `a // b`
 */
export function floorDiv(a: number, b: number): number {
  let q = Math.floor(a / b);
  if (q * b > a) q -= 1;
  else if ((q + 1) * b <= a) q += 1;
  return q;
}
