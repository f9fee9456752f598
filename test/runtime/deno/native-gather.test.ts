// The native gather under Deno (Deno.dlopen): the same copies as on Node, on this thread and as a nonblocking call.

import assert from "node:assert/strict";
import { loadDenoPieceCopier } from "../../../src/runtime/native-gather-deno.ts";

function pattern(n: number): Uint8Array {
  const b = new Uint8Array(n);
  for (let i = 0; i < n; i++) b[i] = (i * 31 + (i >> 8)) & 0xff;
  return b;
}

Deno.test("the native gather loads and copies pieces of views at their offsets, on this thread and on another", async () => {
  const copier = loadDenoPieceCopier();
  assert.ok(copier, "native/build/librackfeed.so did not load (scripts/build-native.mjs builds it)");
  const big = pattern(1 << 16);
  const view = big.subarray(1000, 5000);
  const pieces = new Float64Array([copier.address(view) + 10, 100, 0, copier.address(big) + 60000, 50, 100]);
  const dst = new Uint8Array(150);
  assert.equal(copier.copy(dst, pieces, 0, 2), 150);
  assert.deepEqual(dst.subarray(0, 100), big.subarray(1010, 1110));
  assert.deepEqual(dst.subarray(100), big.subarray(60000, 60050));
  const again = new Uint8Array(150);
  assert.equal(await copier.copyOnThread(again, pieces, 1, 2), 50);
  assert.deepEqual(again.subarray(100), big.subarray(60000, 60050));
  assert.ok(again.subarray(0, 100).every((b) => b === 0));
});
