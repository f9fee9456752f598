import { expect } from "vitest";
import { connectUnix } from "../../src/client/node.ts";
import { encodeFrame, FrameDecoder, SHM_PROTOCOL_VERSION } from "../../src/shm/protocol.ts";

/** A raw shm control connection that has said hello: `next()` reads one message; `welcome` is the server's answer. */
export interface GreetedControl {
  readonly s: Awaited<ReturnType<typeof connectUnix>>;
  readonly next: () => Promise<Record<string, unknown>>;
  readonly welcome: Record<string, unknown>;
}

/**
 * Connects to a server's control socket and says hello (no token: the test runs as the server's user).
 *
 * @param socketPath the server's control socket
 */
export async function greetedControl(socketPath: string): Promise<GreetedControl> {
  const s = await connectUnix(socketPath);
  const dec = new FrameDecoder();
  const inbox: Record<string, unknown>[] = [];
  const next = async () => {
    while (inbox.length === 0) {
      const chunk = await s.read();
      if (chunk === null) throw new Error("closed");
      inbox.push(...dec.push(chunk));
    }
    return inbox.shift()!;
  };
  s.write(encodeFrame({ t: "hello", version: SHM_PROTOCOL_VERSION }));
  const welcome = await next();
  expect(welcome.t).toBe("welcome");
  return { s, next, welcome };
}
