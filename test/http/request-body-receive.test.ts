import { Hono } from "hono";
import { describe, expect, it } from "vitest";
import { errorHandler } from "../../src/http/error-handler.ts";
import { RequestBodies } from "../../src/http/middleware/request-bodies.ts";

/** An app with one body route behind `bodies`, answering with what its handler parsed. */
function appWith(bodies: RequestBodies): Hono {
  const app = new Hono();
  app.onError(errorHandler(() => {}));
  app.post("/r", bodies.limit(1000, "Too large: at most 1000 bytes"), async (c) => c.json({ got: await c.req.json() }));
  return app;
}

/** A body stream that sends `first` and then nothing, until cancelled (which it records). */
function stalledBody(first: string): { body: ReadableStream<Uint8Array>; cancelled: Promise<void> } {
  let onCancel!: () => void;
  const cancelled = new Promise<void>((r) => (onCancel = r));
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      c.enqueue(new TextEncoder().encode(first));
    },
    cancel() {
      onCancel();
    },
  });
  return { body, cancelled };
}

describe("RequestBodies", () => {
  it("hands the handler the body it received, and frees its share once the handler is done", async () => {
    const bodies = new RequestBodies(10_000);
    const res = await appWith(bodies).request("/r", { method: "POST", body: JSON.stringify({ a: [1, 2] }), headers: { "content-type": "application/json" } });
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ got: { a: [1, 2] } });
    expect(bodies.usedBytes).toBe(0);
  });

  it("answers 408 to a body that stops coming, stops reading it, and frees its share of the budget", async () => {
    const bodies = new RequestBodies(10_000, 200);
    const { body, cancelled } = stalledBody('{"a": ');
    const t0 = performance.now();
    const res = await appWith(bodies).request("/r", { method: "POST", body, headers: { "content-type": "application/json" }, duplex: "half" } as RequestInit);
    expect(res.status).toBe(408);
    expect((await res.json()).message).toMatch(/did not arrive whole within 0.2 s/);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(150);
    await cancelled; // the rest is not read
    expect(bodies.usedBytes).toBe(0);
  });

  it("answers 413 to a body past its route's bound whether or not it declares its length", async () => {
    const bodies = new RequestBodies(10_000);
    const app = appWith(bodies);
    const declared = await app.request("/r", { method: "POST", body: "x".repeat(2000) });
    expect(declared.status).toBe(413);
    const streamed = new ReadableStream<Uint8Array>({
      start(c) {
        for (let i = 0; i < 3; i++) c.enqueue(new Uint8Array(600));
        c.close();
      },
    });
    const undeclared = await app.request("/r", { method: "POST", body: streamed, duplex: "half" } as RequestInit);
    expect(undeclared.status).toBe(413);
    expect((await undeclared.json()).message).toBe("Too large: at most 1000 bytes");
    expect(bodies.usedBytes).toBe(0);
  });

  it("answers 400 to a body whose stream breaks (its client left mid-body), logs no server error, and frees its share", async () => {
    const bodies = new RequestBodies(10_000);
    const logged: string[] = [];
    const app = new Hono();
    app.onError(errorHandler((m) => logged.push(m)));
    app.post("/r", bodies.limit(1000, "Too large"), async (c) => c.json({ got: await c.req.json() }));
    const broken = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(new TextEncoder().encode('{"a": '));
        setTimeout(() => c.error(new Error("aborted")), 20);
      },
    });
    const res = await app.request("/r", { method: "POST", body: broken, duplex: "half" } as RequestInit);
    expect(res.status).toBe(400);
    expect((await res.json()).message).toMatch(/The request body was cut off before its end \(aborted\)/);
    expect(logged).toEqual([]);
    expect(bodies.usedBytes).toBe(0);
  });

  it("refuses a budget or a deadline that is not a positive number", () => {
    expect(() => new RequestBodies(0)).toThrow(/budgetBytes must be a positive integer/);
    expect(() => new RequestBodies(100, 0)).toThrow(/receiveMs must be a positive number/);
  });
});
