import * as net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeWorkspace, type RunningServer, startServer, waitFor, type Workspace } from "../helpers/rackfeed.ts";

let ws: Workspace;
let rf: RunningServer;

beforeAll(async () => {
  ws = await makeWorkspace();
  rf = await startServer(ws, ["--request-body-bytes", "2MiB"]);
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

/**
 * A telemetry POST that declares `length` bytes (none: chunked) and sends only `sent` of them, so
 * that it holds its share of the budget. The server may take a poll sent after it first (another
 * connection, parsed sooner): the poll then holds part of the budget when this arrives, and this
 * is refused with a 503 on its socket. `stillHeld` sends it again in that case, so a test waits for
 * the refusal it means to see, not for a race it lost once (CI timed out so).
 */
class StalledPost {
  #socket!: net.Socket;
  #answered = false;

  private constructor(readonly length: number | undefined, readonly sent: number) {}

  static async start(length: number | undefined, sent: number): Promise<StalledPost> {
    const post = new StalledPost(length, sent);
    await post.#send();
    return post;
  }

  /** Whether the server still holds it; when it answered (a refusal), it is sent again first. */
  async stillHeld(): Promise<boolean> {
    if (!this.#answered) return true;
    this.#socket.destroy();
    await this.#send();
    return false;
  }

  destroy(): void {
    this.#socket.destroy();
  }

  #send(): Promise<void> {
    const { port } = new URL(rf.url);
    this.#answered = false;
    return new Promise((resolve, reject) => {
      const s = (this.#socket = net.connect(Number(port), "127.0.0.1", () => {
        const head = this.length === undefined ? "transfer-encoding: chunked" : `content-length: ${this.length}`;
        s.write(`POST /v1/telemetry HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n${head}\r\n\r\n`);
        const part = "[".padEnd(this.sent, " ");
        s.write(this.length === undefined ? `${this.sent.toString(16)}\r\n${part}\r\n` : part, () => resolve());
      }));
      s.on("data", () => (this.#answered = true));
      s.on("error", reject);
    });
  }
}

const report = JSON.stringify({ dataset: "none", rank: 0, world: 1, micro_batch: 1, steps: [] });
const post = (body: string) => fetch(`${rf.url}/v1/telemetry`, { method: "POST", headers: { "content-type": "application/json" }, body });

describe("request bodies received at once", () => {
  it("refuses a body with 503 and Retry-After while stalled ones hold the budget, and takes it again once they go", async () => {
    // 1.5 MB declared and 1 KB sent: 1.5 of the 2 MiB held until the body comes or its client goes.
    const stalled = await StalledPost.start(1_500_000, 1024);
    try {
      await waitFor(async () => (await stalled.stillHeld()) && (await post("x".repeat(600_000))).status === 503, "a second large body refused");
      const refused = await post("x".repeat(600_000));
      expect(refused.status).toBe(503);
      expect(refused.headers.get("retry-after")).toBe("1");
      expect((await refused.json()).message).toMatch(/Too many request bodies being received at once \(1500000 of --request-body-bytes 2097152\); retry shortly/);
      // A small one still fits beside it.
      expect((await post(report)).status).not.toBe(503);
    } finally {
      stalled.destroy();
    }
    await waitFor(async () => (await post("[" + " ".repeat(600_000) + "]")).status !== 503, "the budget back once the stalled client left");
  });

  it("counts a body without Content-Length at its route's bound (2 MiB for a report): nothing else large fits beside it", async () => {
    const stalled = await StalledPost.start(undefined, 1024);
    try {
      await waitFor(async () => (await stalled.stillHeld()) && (await post("x".repeat(200_000))).status === 503, "a body refused beside a chunked one");
    } finally {
      stalled.destroy();
    }
    await waitFor(async () => (await post(report)).status !== 503, "the budget back");
  });
});
