import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { selfSignedCert } from "../helpers/tls.ts";
import { TUNABLES } from "../../src/config/defaults.ts";
import { errorOf, load } from "../helpers/config.ts";
import { formatBytes, parseDuration, parseSize } from "../../src/config/size.ts";

describe("sizes and durations", () => {
  it("parses sizes with binary and decimal units", () => {
    expect(parseSize("512MiB", "x")).toBe(512 * 2 ** 20);
    expect(parseSize("1GB", "x")).toBe(1e9);
    expect(parseSize("4096", "x")).toBe(4096);
    expect(parseSize(" 8 KiB ", "x")).toBe(8192);
    expect(parseSize("1.5GiB", "x")).toBe(1.5 * 2 ** 30);
  });
  it("refuses sizes that are not sizes, naming the flag", () => {
    for (const bad of ["12 parsecs", "-1MiB", "", "MiB", "0x10"]) {
      expect(() => parseSize(bad, "--memory-bytes")).toThrow(/--memory-bytes/);
    }
  });
  it("parses durations in ms, s, m and h", () => {
    expect(parseDuration("250ms", "x")).toBe(250);
    expect(parseDuration("2s", "x")).toBe(2000);
    expect(parseDuration("1m", "x")).toBe(60_000);
    expect(parseDuration("1h", "x")).toBe(3_600_000);
    expect(() => parseDuration("soon", "--metadata-ttl")).toThrow(/--metadata-ttl.*"soon"/);
  });
  it("refuses a duration without a unit, but 0: 5 read as 5 ms where 5 s was meant would pass unseen", () => {
    expect(parseDuration("0", "x")).toBe(0);
    expect(parseDuration(0, "x")).toBe(0);
    expect(() => parseDuration("5", "--read-ahead-seconds")).toThrow(/--read-ahead-seconds: "5" has no unit; write 5s or 5ms/);
    expect(() => parseDuration(5, "readAheadSeconds")).toThrow(/readAheadSeconds: 5 has no unit/);
    expect(() => parseDuration(-5, "readAheadSeconds")).toThrow(/readAheadSeconds: expected a duration such as 250ms.*received -5$/);
    // Through every source: a flag, the environment and a config file.
    expect(errorOf(() => load(["--read-ahead-seconds", "5"])).message).toMatch(/--read-ahead-seconds.*no unit/);
    expect(errorOf(() => load([], { RACKFEED_SHUTDOWN_GRACE: "30" })).message).toMatch(/RACKFEED_SHUTDOWN_GRACE.*no unit/);
    const files = { "/srv/t.json": JSON.stringify({ originTimeout: 10 }) };
    expect(errorOf(() => load(["--config", "t.json"], {}, files)).message).toMatch(/"originTimeout" in t\.json.*no unit/);
    expect(load(["--read-ahead-seconds", "5s"]).readAheadSeconds).toBe(5000);
  });
  it("formats bytes for people", () => {
    expect(formatBytes(8 * 2 ** 20)).toBe("8 MiB");
    expect(formatBytes(512)).toBe("512 B");
  });
});

describe("loadConfig", () => {
  it("applies every default from the one defaults table", () => {
    const c = load([]);
    expect(c.listen).toEqual({ hostname: "127.0.0.1", port: 8080 });
    expect(c.blockBytes).toBe(8 * 2 ** 20);
    expect(c.memoryBytes).toBe(2 ** 30);
    expect(c.cacheDir).toBe("/srv/.rackfeed-cache");
    expect(c.readToken).toBeUndefined();
    expect(Object.keys(TUNABLES).every((k) => k in c)).toBe(true);
  });

  it("takes flags over environment over config file over defaults", () => {
    const files = { "/srv/rf.json": JSON.stringify({ memoryBytes: "2GiB", diskBytes: "3GiB", blockBytes: "4MiB" }) };
    const c = load(
      ["--config", "rf.json", "--memory-bytes", "512MiB"],
      { RACKFEED_MEMORY_BYTES: "1GiB", RACKFEED_DISK_BYTES: "5GiB" },
      files,
    );
    expect(c.memoryBytes).toBe(512 * 2 ** 20); // flag
    expect(c.diskBytes).toBe(5 * 2 ** 30); // env over file
    expect(c.blockBytes).toBe(4 * 2 ** 20); // file over default
  });

  it("reads origins from flags and the config file, resolving relative paths and file:// URLs", () => {
    const files = { "/etc/rf.json": JSON.stringify({ origins: { a: "./data", b: "file:///mnt/nfs/b" } }) };
    const c = load(["--config", "/etc/rf.json", "--origin", "c=/srv/c"], {}, files);
    expect(c.origins).toEqual([
      { name: "a", kind: "fs", root: "/srv/data" },
      { name: "b", kind: "fs", root: "/mnt/nfs/b" },
      { name: "c", kind: "fs", root: "/srv/c" },
    ]);
  });

  it("parses IPv6 and port-0 listen addresses", () => {
    expect(load(["--listen", "[::1]:0"]).listen).toEqual({ hostname: "::1", port: 0 });
    expect(load(["--listen", "0.0.0.0:9000"]).listen).toEqual({ hostname: "0.0.0.0", port: 9000 });
  });

  const bad: [string[], RegExp][] = [
    [["--memory-bytes", "lots"], /--memory-bytes.*"lots"/],
    [["--memory-bytes", "10KiB"], /--memory-bytes.*between/],
    [["--block-bytes", "1GiB"], /--block-bytes/],
    [["--block-bytes", "4097"], /--block-bytes: expected a multiple of 8 bytes, received 4097/],
    [["--part-bytes", "16MiB", "--block-bytes", "8MiB"], /--part-bytes.*exceeds --block-bytes/],
    [["--origin-concurrency", "0"], /--origin-concurrency.*integer from 1/],
    [["--origin-concurrency", "2.5"], /--origin-concurrency/],
    [["--listen", "localhost"], /--listen "localhost".*HOST:PORT/],
    [["--listen", "127.0.0.1:70000"], /--listen/],
    [["--origin", "noequals"], /--origin "noequals".*NAME=URL/],
    [["--origin", "a=relative/but/fine", "--origin", "b@d=/x"], /origin/i],
    [["--origin", "x=http://example.com/data"], /--origin x/],
    [["--read-token", "short"], /--read-token.*at least 8/],
    [["--admin-token", "pässwörd-with-umlauts"], /--admin-token.*visible ASCII/],
    [["--read-token", "token with spaces"], /--read-token.*visible ASCII/],
    [["--no-such-flag", "1"], /no-such-flag/],
    [["--metadata-ttl", "2 weeks"], /--metadata-ttl/],
    [["--native-gather-threads", "0"], /--native-gather-threads: expected auto or an integer from 1 to 64, received "0"/],
    [["--native-gather-threads", "many"], /--native-gather-threads/],
  ];
  for (const [args, message] of bad) {
    it(`refuses ${args.join(" ")} with a message naming what to fix`, () => {
      expect(errorOf(() => load(args)).message).toMatch(message);
    });
  }

  it("names where a bad listen address came from: the flag, the environment variable or the config file", () => {
    expect(errorOf(() => load(["--listen", "nope"])).message).toMatch(/Invalid --listen "nope"/);
    expect(errorOf(() => load([], { RACKFEED_LISTEN: "nope" })).message).toMatch(/Invalid environment variable RACKFEED_LISTEN "nope"/);
  });

  it("reads --native-gather-threads as auto (0) or a thread count", () => {
    expect(load([]).nativeGatherThreads).toBe(0);
    expect(load(["--native-gather-threads", "auto"]).nativeGatherThreads).toBe(0);
    expect(load(["--native-gather-threads", "AUTO"]).nativeGatherThreads).toBe(0);
    expect(load(["--native-gather-threads", "3"]).nativeGatherThreads).toBe(3);
  });

  it("names the environment variable when it is the bad source", () => {
    expect(errorOf(() => load([], { RACKFEED_BLOCK_BYTES: "huge" })).message).toMatch(/RACKFEED_BLOCK_BYTES/);
  });

  it("names the config file and field for bad or unknown fields", () => {
    const files = {
      "/srv/a.json": JSON.stringify({ memoryBytes: true }),
      "/srv/b.json": JSON.stringify({ memoryByts: "1GiB" }),
      "/srv/c.json": "{ not json",
      "/srv/d.json": "[]",
    };
    expect(errorOf(() => load(["--config", "a.json"], {}, files)).message).toMatch(/"memoryBytes" in a\.json/);
    expect(errorOf(() => load(["--config", "b.json"], {}, files)).message).toMatch(/Unknown field "memoryByts"/);
    expect(errorOf(() => load(["--config", "c.json"], {}, files)).message).toMatch(/Cannot parse config file \/srv\/c\.json/);
    expect(errorOf(() => load(["--config", "d.json"], {}, files)).message).toMatch(/expected a JSON object/);
    expect(errorOf(() => load(["--config", "missing.json"], {}, files)).message).toMatch(/Cannot read config file/);
  });
});

describe("loadConfig part size", () => {
  it("shrinks the default part size to a smaller block size, but refuses an explicit part larger than a block", () => {
    expect(load(["--block-bytes", "64KiB"]).partBytes).toBe(65536);
    expect(() => load(["--block-bytes", "64KiB", "--part-bytes", "1MiB"])).toThrow(/--part-bytes/);
  });
});

describe("loadConfig origin concurrency", () => {
  it("lets the adaptive maximum follow a larger --origin-concurrency, and refuses an explicit maximum below it", () => {
    expect(load([])).toMatchObject({ originConcurrency: 16, originConcurrencyMax: 64, originTargetBandwidth: 2 ** 30 });
    expect(load(["--origin-concurrency", "100"]).originConcurrencyMax).toBe(100);
    expect(load(["--origin-concurrency", "8", "--origin-concurrency-max", "8"]).originConcurrencyMax).toBe(8);
    expect(() => load(["--origin-concurrency", "32", "--origin-concurrency-max", "16"])).toThrow(
      /--origin-concurrency-max: 16 is below --origin-concurrency 32/,
    );
  });
});

describe("loadConfig TLS", () => {
  it("refuses at start-up a certificate that does not parse, or a key that is not the certificate's, naming both flags", () => {
    const dir = mkdtempSync(join(tmpdir(), "rackfeed-tls-config-"));
    try {
      const a = selfSignedCert(dir, "a");
      const b = selfSignedCert(dir, "b");
      const files = {
        "/srv/a-cert.pem": readFileSync(a.cert, "utf8"),
        "/srv/a-key.pem": readFileSync(a.key, "utf8"),
        "/srv/b-key.pem": readFileSync(b.key, "utf8"),
        "/srv/junk.pem": "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n",
      };
      expect(load(["--tls-cert", "a-cert.pem", "--tls-key", "a-key.pem"], {}, files).tls?.cert).toContain("BEGIN");
      const mismatch = errorOf(() => load(["--tls-cert", "a-cert.pem", "--tls-key", "b-key.pem"], {}, files));
      expect(mismatch.message).toMatch(/Invalid --tls-cert\/--tls-key \(a-cert\.pem, b-key\.pem\): .*mismatch/);
      const junk = errorOf(() => load(["--tls-cert", "junk.pem", "--tls-key", "a-key.pem"], {}, files));
      expect(junk.message).toMatch(/Invalid --tls-cert\/--tls-key \(junk\.pem, a-key\.pem\)/);
      // Swapped files: refused by their PEM blocks, which Deno's runtime checks too (it checks no key at start-up).
      expect(errorOf(() => load(["--tls-cert", "a-cert.pem", "--tls-key", "a-cert.pem"], {}, files)).message).toMatch(/Invalid --tls-key: .*a-cert\.pem holds no private key/);
      expect(errorOf(() => load(["--tls-cert", "a-key.pem", "--tls-key", "a-key.pem"], {}, files)).message).toMatch(/Invalid --tls-cert: .*a-key\.pem holds no certificate/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("loadConfig batch bodies", () => {
  it("bounds batch bodies in flight at 1 GiB by default, follows a larger --max-batch-bytes, and refuses an explicit bound below it", () => {
    expect(load([])).toMatchObject({ batchInflightBytes: 2 ** 30, batchPoolBytes: 64 * 2 ** 20, maxBatchBytes: 256 * 2 ** 20 });
    expect(load(["--max-batch-bytes", "2GiB"]).batchInflightBytes).toBe(2 * 2 ** 30);
    expect(load(["--batch-inflight-bytes", "256MiB"]).batchInflightBytes).toBe(256 * 2 ** 20);
    expect(() => load(["--batch-inflight-bytes", "128MiB"])).toThrow(
      /--batch-inflight-bytes: 134217728 is below --max-batch-bytes 268435456/,
    );
    expect(load(["--batch-pool-bytes", "0"]).batchPoolBytes).toBe(0);
  });

  it("bounds the blocks object responses send at 1 GiB by default, at least one block, and refuses an explicit bound below a block", () => {
    expect(load([]).objectInflightBytes).toBe(2 ** 30);
    expect(load(["--object-inflight-bytes", "64MiB"]).objectInflightBytes).toBe(64 * 2 ** 20);
    // Blocks of 256 MiB: four fit under the default, so it stands.
    expect(load(["--block-bytes", "256MiB", "--memory-bytes", "1GiB"]).objectInflightBytes).toBe(2 ** 30);
    expect(() => load(["--block-bytes", "16MiB", "--object-inflight-bytes", "8MiB"])).toThrow(
      /--object-inflight-bytes: 8388608 is below --block-bytes 16777216; no object could be sent/,
    );
  });

  it("refuses a --max-batch-bytes over 4 GiB at start-up (Node allocates no larger buffer: such a batch was a 500)", () => {
    expect(load(["--max-batch-bytes", "4GiB"]).maxBatchBytes).toBe(4 * 2 ** 30);
    expect(() => load(["--max-batch-bytes", "16GiB"])).toThrow(/--max-batch-bytes.*between 4096 and 4294967296 bytes, received 17179869184/);
  });
});

describe("loadConfig integer settings", () => {
  it("refuses empty, blank, hexadecimal and exponent values of integer and factor settings, naming the setting", () => {
    const cases: [string[], Record<string, string>, RegExp][] = [
      [[], { RACKFEED_DISK_WRITE_QUEUE: "" }, /Invalid environment variable RACKFEED_DISK_WRITE_QUEUE: expected an integer from 0 to 1024, received ""/],
      [[], { RACKFEED_READ_AHEAD_BLOCKS: " " }, /Invalid environment variable RACKFEED_READ_AHEAD_BLOCKS: expected an integer .*received " "/],
      [[], { RACKFEED_ORIGIN_HEDGE: "" }, /Invalid environment variable RACKFEED_ORIGIN_HEDGE: expected 0 \(off\) or a number/],
      [["--origin-concurrency", "0x10"], {}, /Invalid --origin-concurrency: expected an integer from 1 to 1024, received "0x10"/],
      [["--origin-queue", "1e3"], {}, /Invalid --origin-queue: expected an integer .*received "1e3"/],
      [["--origin-hedge", "1e1"], {}, /Invalid --origin-hedge: .*received "1e1"/],
      [["--origin-retries", ""], {}, /Invalid --origin-retries: .*received ""/],
    ];
    for (const [args, env, message] of cases) {
      expect(errorOf(() => load(args, env)).message, `${args.join(" ")} ${JSON.stringify(env)}`).toMatch(message);
    }
    // Decimal integers (with blanks around them) and decimal factors still parse.
    expect(load(["--origin-concurrency", " 16 ", "--origin-hedge", "2.5"], { RACKFEED_DISK_WRITE_QUEUE: "0" })).toMatchObject({
      originConcurrency: 16,
      originHedge: 2.5,
      diskWriteQueue: 0,
    });
  });
});

describe("loadConfig disk budget", () => {
  it("refuses a --disk-bytes that cannot hold one block file, and accepts one that can", () => {
    expect(errorOf(() => load(["--disk-bytes", "8MiB"])).message).toMatch(
      /Invalid --disk-bytes: 8388608 cannot hold one block file \(--block-bytes 8388608 plus its header\)/,
    );
    expect(errorOf(() => load(["--block-bytes", "1MiB"], { RACKFEED_DISK_BYTES: "1MiB" })).message).toMatch(/Invalid --disk-bytes/);
    expect(load(["--block-bytes", "4MiB", "--disk-bytes", "8MiB"]).diskBytes).toBe(8 * 2 ** 20);
  });
});

describe("loadConfig dataset index memory", () => {
  it("bounds dataset index memory at 4 GiB by default, takes --dataset-index-bytes or its variable, and refuses less than 1 MiB at start-up", () => {
    expect(load([]).datasetIndexBytes).toBe(4 * 2 ** 30);
    expect(load(["--dataset-index-bytes", "16GiB"]).datasetIndexBytes).toBe(16 * 2 ** 30);
    expect(load([], { RACKFEED_DATASET_INDEX_BYTES: "512MiB" }).datasetIndexBytes).toBe(512 * 2 ** 20);
    expect(errorOf(() => load(["--dataset-index-bytes", "64KiB"])).message).toMatch(/Invalid --dataset-index-bytes: expected between 1048576 and .* bytes, received 65536/);
    expect(errorOf(() => load(["--dataset-index-bytes", "lots"])).message).toMatch(/--dataset-index-bytes/);
  });
});
