import { describe, expect, it } from "vitest";
import type { S3Origin } from "../../src/origin/s3-origin.ts";
import { defaultOrigin } from "../../src/server.ts";
import { errorOf, load } from "../helpers/config.ts";

describe("loadConfig s3:// origins", () => {
  it("parses bucket and prefix, treating the prefix as a folder", () => {
    const c = load(["--origin", "a=s3://bucket-1/train", "--origin", "b=s3://bucket-2", "--origin", "c=s3://b3/x/y/"]);
    expect(c.origins).toEqual([
      { name: "a", kind: "s3", bucket: "bucket-1", prefix: "train/" },
      { name: "b", kind: "s3", bucket: "bucket-2", prefix: "" },
      { name: "c", kind: "s3", bucket: "b3", prefix: "x/y/" },
    ]);
  });

  it("takes the endpoint and region from the AWS environment, with path style and us-east-1 for custom endpoints", () => {
    const c = load(["--origin", "a=s3://bucket/p"], { AWS_ENDPOINT_URL: "http://127.0.0.1:9000" });
    expect(c.origins[0]).toEqual({
      name: "a",
      kind: "s3",
      bucket: "bucket",
      prefix: "p/",
      endpoint: "http://127.0.0.1:9000",
      forcePathStyle: true,
      region: "us-east-1",
    });
    const d = load(["--origin", "a=s3://bucket/p"], {
      AWS_ENDPOINT_URL: "http://x:1",
      AWS_ENDPOINT_URL_S3: "http://s3only:2",
      AWS_REGION: "eu-west-1",
    });
    expect(d.origins[0]).toMatchObject({ endpoint: "http://s3only:2", region: "eu-west-1" });
    // Plain AWS: the SDK chain decides (profile, IMDS), nothing is pinned.
    expect(load(["--origin", "a=s3://bucket"]).origins[0]).toEqual({ name: "a", kind: "s3", bucket: "bucket", prefix: "" });
  });

  it("accepts per-origin endpoint, region and forcePathStyle in the config file, over the environment", () => {
    const file = JSON.stringify({
      origins: {
        minio: { url: "s3://data/sets", endpoint: "http://10.0.0.5:9000", region: "local", forcePathStyle: false },
        aws: "s3://prod-bucket/x",
        disk: { url: "/mnt/nfs" },
      },
    });
    const c = load(["--config", "c.json"], { AWS_ENDPOINT_URL: "http://env:1" }, { "/srv/c.json": file });
    expect(c.origins).toEqual([
      {
        name: "minio",
        kind: "s3",
        bucket: "data",
        prefix: "sets/",
        endpoint: "http://10.0.0.5:9000",
        forcePathStyle: false,
        region: "local",
      },
      { name: "aws", kind: "s3", bucket: "prod-bucket", prefix: "x/", endpoint: "http://env:1", forcePathStyle: true, region: "us-east-1" },
      { name: "disk", kind: "fs", root: "/mnt/nfs" },
    ]);
  });

  it("refuses bad buckets, unknown fields and bad overrides, naming the origin", () => {
    expect(errorOf(() => load(["--origin", "a=s3://Bad_Bucket/x"])).message).toMatch(/--origin a.*does not name an S3 bucket/);
    expect(errorOf(() => load(["--origin", "a=s3://bucket//x"])).message).toMatch(/empty segment/);
    const bad = (entry: unknown) =>
      errorOf(() => load(["--config", "c.json"], {}, { "/srv/c.json": JSON.stringify({ origins: { o: entry } }) })).message;
    expect(bad({ url: "s3://b1/x", endPoint: "http://x" })).toMatch(/Unknown field "endPoint" in "origins.o"/);
    expect(bad({ url: "s3://b1/x", endpoint: "ftp://x" })).toMatch(/"endpoint" must be an http/);
    expect(bad({ url: "s3://b1/x", forcePathStyle: "yes" })).toMatch(/"forcePathStyle" must be true or false/);
    expect(bad({ url: "/mnt/x", region: "r" })).toMatch(/apply to s3:\/\/ origins only/);
    expect(bad(42)).toMatch(/expected a URL string or/);
  });

  it("parses the fault tunables", () => {
    const c = load(["--origin-timeout", "250ms", "--origin-retries", "0", "--origin-hedge", "0"], { RACKFEED_ORIGIN_BACKOFF: "10ms" });
    expect([c.originTimeout, c.originRetries, c.originHedge, c.originBackoff, c.originBackoffMax]).toEqual([250, 0, 0, 10, 2000]);
    expect(errorOf(() => load(["--origin-timeout", "0"])).message).toMatch(/--origin-timeout.*above 0/);
    expect(errorOf(() => load(["--origin-hedge", "0.5"])).message).toMatch(/--origin-hedge.*0 \(off\)/);
  });
});

describe("--s3-http", () => {
  it("is auto by default and takes node, fetch or auto from the flag, the environment or the file", () => {
    expect(load([]).s3Http).toBe("auto");
    expect(load(["--s3-http", "fetch"]).s3Http).toBe("fetch");
    expect(load([], { RACKFEED_S3_HTTP: "node" }).s3Http).toBe("node");
    expect(load(["--config", "/srv/c.json"], {}, { "/srv/c.json": JSON.stringify({ s3Http: "fetch" }) }).s3Http).toBe("fetch");
    expect(errorOf(() => load(["--s3-http", "curl"])).message).toMatch(/--s3-http.*curl/);
  });

  it("gives S3 origins the runtime's client under auto, and the one named otherwise", async () => {
    const spec = (c: ReturnType<typeof load>) => c.origins[0];
    const auto = load(["--origin", "a=s3://bucket/p"]);
    expect(((await defaultOrigin(spec(auto), auto)) as S3Origin).http).toBe("node");
    expect(((await defaultOrigin(spec(auto), auto, { s3HttpAuto: "fetch" })) as S3Origin).http).toBe("fetch");
    const node = load(["--origin", "a=s3://bucket/p", "--s3-http", "node"]);
    expect(((await defaultOrigin(spec(node), node, { s3HttpAuto: "fetch" })) as S3Origin).http).toBe("node");
    const fetch = load(["--origin", "a=s3://bucket/p", "--s3-http", "fetch"]);
    expect(((await defaultOrigin(spec(fetch), fetch, { s3HttpAuto: "node" })) as S3Origin).http).toBe("fetch");
  });
});
