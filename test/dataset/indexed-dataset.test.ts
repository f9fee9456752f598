import { describe, expect, it } from "vitest";
import { isCacheServerError } from "../../src/errors.ts";
import { checkBinSize, DatasetFormatError, DTYPE_CODES, encodeIndex, parseIndex } from "../../src/dataset/mod.ts";
import { vectorBytes } from "./vector-files.ts";

function formatError(fn: () => unknown): DatasetFormatError {
  try {
    fn();
  } catch (e) {
    if (e instanceof DatasetFormatError) return e;
    throw e;
  }
  throw new Error("expected a DatasetFormatError, nothing was thrown");
}

describe("parseIndex() on the public vector files", () => {
  it("parseIndex() reads the spec's worked example pub_i32_b.idx", () => {
    const bin = vectorBytes("data/pub_i32_b.bin");
    const ix = parseIndex(vectorBytes("data/pub_i32_b.idx"), { path: "data/pub_i32_b.idx", binSize: bin.byteLength });
    expect(ix.dtype).toBe("int32");
    expect(ix.dtypeCode).toBe(4);
    expect(ix.itemSize).toBe(4);
    expect(ix.sequenceCount).toBe(100);
    expect(ix.documentCount).toBe(100);
    expect(Array.from(ix.lengths.subarray(0, 3))).toEqual([444, 265, 177]);
    expect(Array.from(ix.pointers.subarray(0, 3))).toEqual([0, 1776, 2836]);
    expect(ix.documentBoundaries[100]).toBe(100);
    const view = new DataView(bin.buffer, bin.byteOffset);
    expect([view.getInt32(ix.pointers[1], true), view.getInt32(ix.pointers[1] + 4, true)]).toEqual([1075263842, 367441592]);
  });

  it("parseIndex() reports the sequence, document and token counts the vectors README gives", () => {
    const expected = [
      ["pub_u16_a", "uint16", 200, 200, 296800],
      ["pub_i32_b", "int32", 100, 100, 48491],
      ["pub_u16_c", "uint16", 128, 60, 62759],
    ] as const;
    for (const [name, dtype, seqs, docs, tokens] of expected) {
      const bin = vectorBytes(`data/${name}.bin`);
      const ix = parseIndex(vectorBytes(`data/${name}.idx`), { path: `${name}.idx`, binSize: bin.byteLength });
      expect([ix.dtype, ix.sequenceCount, ix.documentCount, ix.totalTokens], name).toEqual([dtype, seqs, docs, tokens]);
      expect(ix.requiredBinBytes).toBe(bin.byteLength);
    }
  });

  it("parseIndex() reads an index that starts at an odd offset inside a larger buffer", () => {
    const idx = vectorBytes("data/pub_u16_c.idx");
    const host = new Uint8Array(idx.byteLength + 3);
    host.set(idx, 3);
    const ix = parseIndex(host.subarray(3), { path: "shifted.idx" });
    expect(Array.from(ix.lengths)).toEqual(Array.from(parseIndex(idx, { path: "c.idx" }).lengths));
  });
});

describe("parseIndex() formats", () => {
  it("parseIndex() accepts every dtype code Megatron writes (1 … 8) with its item size", () => {
    const sizes: Record<string, number> = {
      uint8: 1, int8: 1, int16: 2, int32: 4, int64: 8, float64: 8, float32: 4, uint16: 2,
    };
    for (let code = 1; code <= 8; code++) {
      const ix = parseIndex(encodeIndex({ dtypeCode: code, lengths: [3, 0, 5] }), { path: `code${code}.idx` });
      expect(ix.dtype).toBe(DTYPE_CODES[code].dtype);
      expect(ix.itemSize).toBe(sizes[ix.dtype]);
      expect(Array.from(ix.pointers)).toEqual([0, 3 * ix.itemSize, 3 * ix.itemSize]);
    }
  });

  it("parseIndex() accepts a multimodal mode array and several sequences per document", () => {
    const ix = parseIndex(
      encodeIndex({ dtypeCode: 8, lengths: [1, 2, 3], documentBoundaries: [0, 2, 3], modes: [0, 1, 0] }),
      { path: "mm.idx" },
    );
    expect(ix.hasModes).toBe(true);
    expect(ix.documentCount).toBe(2);
    expect(ix.sequenceCount).toBe(3);
  });

  it("parseIndex() keeps 64-bit pointers past 4 GiB exact", () => {
    const ix = parseIndex(encodeIndex({ dtypeCode: 4, lengths: [2], pointers: [2 ** 40 + 12] }), { path: "big.idx" });
    expect(ix.pointers[0]).toBe(2 ** 40 + 12);
  });
});

describe("parseIndex() refuses malformed files with a DatasetFormatError naming the file", () => {
  const good = encodeIndex({ dtypeCode: 8, lengths: [4, 5, 6] });

  it("parseIndex() refuses bad magic bytes", () => {
    const bad = good.slice();
    bad[0] = 0x4e;
    const err = formatError(() => parseIndex(bad, { path: "a/b.idx" }));
    expect(err.message).toMatch(/^Cannot read index "a\/b\.idx": bad magic bytes 4e 4d 49/);
    expect(err.file).toBe("a/b.idx");
    expect(isCacheServerError(err) && err.code).toBe("BAD_REQUEST");
  });

  it("parseIndex() refuses a pointer inside a token (a sequence must start at a whole token)", () => {
    const odd = encodeIndex({ dtypeCode: 8, lengths: [4, 5], pointers: [0, 9] }); // uint16: 9 is mid-token
    expect(formatError(() => parseIndex(odd, { path: "odd.idx" })).message).toMatch(/"odd\.idx": sequence 1 has pointer 9, not a multiple of its 2-byte tokens/);
  });

  it("parseIndex() refuses a version other than 1", () => {
    const bad = good.slice();
    bad[9] = 2;
    expect(formatError(() => parseIndex(bad, { path: "v.idx" })).message).toMatch(/"v\.idx": unsupported version 2/);
  });

  it("parseIndex() refuses unknown dtype codes", () => {
    for (const code of [0, 9, 255]) {
      const bad = good.slice();
      bad[17] = code;
      expect(formatError(() => parseIndex(bad, { path: "d.idx" })).message).toContain(`"d.idx": unknown dtype code ${code}`);
    }
  });

  it("parseIndex() refuses truncated files, in the header and in the arrays", () => {
    expect(formatError(() => parseIndex(good.subarray(0, 20), { path: "t.idx" })).message).toMatch(/"t\.idx": truncated: 20 bytes/);
    const err = formatError(() => parseIndex(good.subarray(0, good.byteLength - 1), { path: "t.idx" }));
    expect(err.message).toMatch(/"t\.idx": truncated: 3 sequences and 4 document boundaries need 102 bytes, file has 101/);
    expect(formatError(() => parseIndex(new Uint8Array(0), { path: "empty.idx" })).file).toBe("empty.idx");
  });

  it("parseIndex() refuses a size that matches neither the declared counts nor a mode array", () => {
    const longer = new Uint8Array(good.byteLength + 1);
    longer.set(good);
    expect(formatError(() => parseIndex(longer, { path: "x.idx" })).message).toMatch(/"x\.idx": size 103 bytes does not match/);
  });

  it("parseIndex() refuses counts too large to address", () => {
    const bad = good.slice();
    new DataView(bad.buffer).setUint32(22, 0xffffffff, true);
    expect(formatError(() => parseIndex(bad, { path: "huge.idx" })).message).toMatch(/"huge\.idx": sequence count .* too large/);
  });

  it("parseIndex() refuses a last document boundary other than the sequence count", () => {
    const bad = encodeIndex({ dtypeCode: 8, lengths: [4, 5, 6], documentBoundaries: [0, 1, 2] });
    expect(formatError(() => parseIndex(bad, { path: "b.idx" })).message).toMatch(/last document boundary is 2 \(expected the sequence count 3\)/);
  });

  it("parseIndex() refuses negative lengths and negative pointers", () => {
    expect(formatError(() => parseIndex(encodeIndex({ dtypeCode: 8, lengths: [4, -5] }), { path: "n.idx" })).message)
      .toMatch(/sequence 1 has negative length -5/);
    expect(formatError(() => parseIndex(encodeIndex({ dtypeCode: 8, lengths: [4], pointers: [-8] }), { path: "p.idx" })).message)
      .toMatch(/sequence 0 has pointer -8/);
  });

  it("parseIndex() and checkBinSize() refuse a .bin too small for the sequences, naming both files", () => {
    const err = formatError(() => parseIndex(good, { path: "o/p.idx", binSize: 29 }));
    expect(err.message).toMatch(/^Cannot read index "o\/p\.idx": counts do not match the \.bin: sequences need at least 30 bytes but "o\/p\.bin" has 29/);
    expect(err.message).toContain("sequence 2");
    const ix = parseIndex(good, { path: "o/p.idx", binSize: 30 });
    expect(() => checkBinSize(ix, 30)).not.toThrow();
    expect(formatError(() => checkBinSize(ix, 0, "elsewhere.bin")).message).toContain('"elsewhere.bin" has 0');
  });

  it("parseIndex() on the real vector refuses the real .bin minus one byte", () => {
    const bin = vectorBytes("data/pub_u16_a.bin");
    expect(formatError(() => parseIndex(vectorBytes("data/pub_u16_a.idx"), { path: "pub_u16_a.idx", binSize: bin.byteLength - 1 })).file)
      .toBe("pub_u16_a.idx");
  });
});
