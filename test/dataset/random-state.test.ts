import { describe, expect, it } from "vitest";
import { RandomState } from "../../src/dataset/mod.ts";
import { sha256Int64, vectorJson } from "./vector-files.ts";

const primitives = vectorJson("primitives.json");

function arange(n: number): Int32Array {
  const a = new Int32Array(n);
  for (let i = 0; i < n; i++) a[i] = i;
  return a;
}

describe("RandomState seeding and raw outputs", () => {
  it("RandomState(seed) fills the MT19937 state as numpy does for every seed in primitives.json", () => {
    for (const c of primitives.mt19937_seeding) {
      const { key, pos } = new RandomState(c.seed).getState();
      expect(Array.from(key.subarray(0, 4)), `seed ${c.seed}`).toEqual(c.state_first4);
      expect(key[623], `seed ${c.seed}`).toBe(c.state_last);
      expect(pos).toBe(624);
    }
  });

  it("RandomState.nextUint32() gives numpy's first ten outputs and outputs 624–627 after the second twist", () => {
    for (const c of primitives.mt19937_seeding) {
      const rs = new RandomState(c.seed);
      const first = Array.from({ length: 10 }, () => rs.nextUint32());
      expect(first, `seed ${c.seed}`).toEqual(c.genrand_int32_first10);
      for (let i = 10; i < 624; i++) rs.nextUint32();
      const later = Array.from({ length: 4 }, () => rs.nextUint32());
      expect(later, `seed ${c.seed}`).toEqual(c.genrand_int32_at_624_to_627);
    }
  });

  it("RandomState matches the spec's check values for seeds 1234 and 0", () => {
    const rs = new RandomState(1234);
    expect(rs.getState().key[1]).toBe(3159640283);
    expect([rs.nextUint32(), rs.nextUint32(), rs.nextUint32(), rs.nextUint32()]).toEqual([
      822569775,
      2137449171,
      2671936806,
      3512589365,
    ]);
    const zero = new RandomState(0);
    expect([zero.nextUint32(), zero.nextUint32(), zero.nextUint32()]).toEqual([2357136044, 2546248239, 3071714933]);
  });

  it("RandomState.nextUint64() puts the first 32-bit output in the high half", () => {
    const rs = new RandomState(1234);
    expect(rs.nextUint64()).toBe((822569775n << 32n) | 2137449171n);
  });

  it("RandomState() refuses seeds numpy refuses", () => {
    expect(() => new RandomState(-1)).toThrow(RangeError);
    expect(() => new RandomState(2 ** 32)).toThrow(/0 … 4294967295/);
    expect(() => new RandomState(1.5)).toThrow(RangeError);
    expect(new RandomState(2 ** 32 - 1).getState().key[0]).toBe(4294967295);
  });
});

describe("RandomState bounded draws", () => {
  it("RandomState.randomInterval() matches numpy's masked draws, 32- and 64-bit branches", () => {
    for (const c of primitives.bounded_draws) {
      const rs = new RandomState(c.seed);
      const values = Array.from({ length: c.values.length }, () => rs.randomInterval(c.max));
      expect(values, `max ${c.max}`).toEqual(c.values);
      const viaRandint = new RandomState(c.seed);
      expect(Array.from({ length: c.values.length }, () => viaRandint.randint(0, c.max + 1))).toEqual(c.values);
    }
  });

  it("RandomState.randomInterval(0) returns 0 without consuming an output", () => {
    const rs = new RandomState(1234);
    expect(rs.randomInterval(0)).toBe(0);
    expect(rs.nextUint32()).toBe(822569775);
  });

  it("RandomState.randint matches numpy for seed 1234 and seed 7 (values from numpy 2.4.6)", () => {
    const rs = new RandomState(1234);
    expect(Array.from({ length: 8 }, () => rs.randint(5, 10))).toEqual([8, 9, 9, 5, 6, 6, 6, 7]);
    const one = new RandomState(7);
    expect(Array.from({ length: 4 }, () => one.randint(1000))).toEqual([175, 196, 537, 502]);
    expect(() => rs.randint(3, 3)).toThrow(RangeError);
  });

  it("RandomState.randomIntegers matches numpy's random_integers for seed 99", () => {
    const rs = new RandomState(99);
    expect(Array.from({ length: 8 }, () => rs.randomIntegers(1, 6))).toEqual([2, 4, 2, 1, 2, 1, 3, 5]);
  });

  it("RandomState.randomInterval() refuses bounds past 2^53", () => {
    expect(() => new RandomState(1).randomInterval(2 ** 53)).toThrow(RangeError);
    expect(() => new RandomState(1).randomInterval(-1)).toThrow(RangeError);
  });
});

describe("RandomState.shuffle", () => {
  it("RandomState.shuffle follows the spec's worked trace for seed 1234 on arange(10), consuming 11 outputs", () => {
    const rs = new RandomState(1234);
    const a = arange(10);
    rs.shuffle(a);
    expect(Array.from(a)).toEqual([7, 2, 9, 1, 0, 8, 4, 5, 6, 3]);
    // The trace consumes eleven outputs (two rejections), so the stream resumes at the twelfth.
    const ref = new RandomState(1234);
    for (let i = 0; i < 11; i++) ref.nextUint32();
    expect(rs.nextUint32()).toBe(ref.nextUint32());
  });

  it("RandomState.shuffle matches numpy for the small arrays in primitives.json", () => {
    for (const c of primitives.shuffle_small) {
      const a = arange(c.n);
      new RandomState(c.seed).shuffle(a);
      expect(Array.from(a), `seed ${c.seed} n ${c.n}`).toEqual(c.result);
    }
  });

  it("RandomState.shuffle matches numpy's digest for arrays up to 200 000 elements", () => {
    for (const c of primitives.shuffle_large) {
      const a = arange(c.n);
      new RandomState(c.seed).shuffle(a);
      expect(Array.from(a.subarray(0, 10))).toEqual(c.first10);
      expect(Array.from(a.subarray(c.n - 10))).toEqual(c.last10);
      expect(sha256Int64(a)).toBe(c.sha256_int64le);
    }
  });

  it("RandomState.shuffle continues the stream across two shuffles on one state", () => {
    const c = primitives.shuffle_two_in_a_row;
    const rs = new RandomState(c.seed);
    const first = arange(c.first_n);
    const second = arange(c.second_n);
    rs.shuffle(first);
    rs.shuffle(second);
    expect(Array.from(first)).toEqual(c.first);
    expect(Array.from(second)).toEqual(c.second);
  });

  it("RandomState.shuffle gives the spec's document-index example: [0,1,2,0,1,2] with seed 1 → [2,1,1,0,0,2]", () => {
    const a = Int32Array.of(0, 1, 2, 0, 1, 2);
    new RandomState(1).shuffle(a);
    expect(Array.from(a)).toEqual([2, 1, 1, 0, 0, 2]);
  });

  it("RandomState.shuffle moves elements, whatever their values and array type", () => {
    const f = Float64Array.of(10.5, 11.5, 12.5, 13.5, 14.5, 15.5, 16.5, 17.5, 18.5, 19.5);
    new RandomState(1234).shuffle(f);
    expect(Array.from(f)).toEqual([7, 2, 9, 1, 0, 8, 4, 5, 6, 3].map((i) => i + 10.5));
    const plain = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
    new RandomState(1234).shuffle(plain);
    expect(plain).toEqual([7, 2, 9, 1, 0, 8, 4, 5, 6, 3]);
  });

  it("RandomState.permutation(n) is arange(n) shuffled, as numpy's permutation", () => {
    expect(Array.from(new RandomState(3).permutation(12))).toEqual([5, 4, 1, 2, 11, 6, 7, 0, 3, 9, 8, 10]);
    expect(new RandomState(3).permutation(0).length).toBe(0);
  });
});
