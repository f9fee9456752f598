/** @module Test fixtures for the S3 suites: the RGW from the global setup, a client, and keys of one's own. */

import { DeleteObjectCommand, PutObjectCommand, S3Client } from "@aws-sdk/client-s3";
import { inject } from "vitest";
import type { S3TestServer } from "../setup/s3-server.ts";

/**
 * The S3 server of this run. Throws (failing the suite, never skipping it) when the global
 * setup could not start one, with the start script's output.
 */
export function s3Server(): S3TestServer {
  const s = inject("s3");
  if (!s) throw new Error("No S3 test server: vitest.config.ts must list test/setup/s3-server.ts in globalSetup");
  if ("error" in s) throw new Error(`The S3 test server could not start, so the S3 tests cannot run:\n${s.error}`);
  // The AWS SDK's default chain (what rackfeed uses) reads credentials from the environment.
  process.env.AWS_ACCESS_KEY_ID = s.accessKeyId;
  process.env.AWS_SECRET_ACCESS_KEY = s.secretAccessKey;
  process.env.AWS_REGION = s.region;
  // The SDK warns once that releases after January 2027 need Node >= 22 (README, S3 origins).
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED = "true";
  return s;
}

/** A plain SDK client for uploads and baselines. */
export function s3Client(s: S3TestServer): S3Client {
  return new S3Client({
    endpoint: s.endpoint,
    region: s.region,
    forcePathStyle: true,
    credentials: { accessKeyId: s.accessKeyId, secretAccessKey: s.secretAccessKey },
  });
}

/** A key prefix no other test (or earlier run) uses, ending in "/". */
export function uniquePrefix(what: string): string {
  return `${what}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}/`;
}

/** Uploads `body` at `key`; returns its ETag. */
export async function put(client: S3Client, bucket: string, key: string, body: Uint8Array | string): Promise<string> {
  const out = await client.send(new PutObjectCommand({ Bucket: bucket, Key: key, Body: body }));
  return out.ETag ?? "";
}

/** Deletes `key`. */
export async function del(client: S3Client, bucket: string, key: string): Promise<void> {
  await client.send(new DeleteObjectCommand({ Bucket: bucket, Key: key }));
}

/** The rackfeed config file (JSON) for an S3 origin `name` at `bucket/prefix` on `endpoint`. */
export function s3ConfigFile(name: string, s: S3TestServer, prefix: string, endpoint = s.endpoint): string {
  return JSON.stringify({
    origins: { [name]: { url: `s3://${s.bucket}/${prefix}`, endpoint, region: s.region } },
  });
}
