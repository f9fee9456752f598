/**
 * @module A loopback TCP proxy whose first connection goes silent after some bytes from the
 * server: no FIN, no RST, as when a NAT or load balancer drops a flow. Later connections pass.
 * It works below TLS and HTTP/2 (the HTTP-level fault proxy cannot stall an HTTP/2 connection).
 * `node:net` only, so Node and Deno tests share it.
 */

import { connect, createServer, type Socket } from "node:net";

/** A running proxy. */
export interface SilentProxy {
  /** `127.0.0.1:PORT`, to put after `https://` or `http://`. */
  readonly hostPort: string;
  /** Connections accepted so far. */
  readonly connections: number;
  /** Client connections open now. */
  readonly open: number;
  /** Whether the first connection has gone silent. */
  readonly silenced: boolean;
  /** Closes the listener and every connection. */
  close(): Promise<void>;
}

/**
 * Forwards 127.0.0.1:`port`; the first connection's bytes from the server stop after `afterBytes`
 * (the socket stays open and reads on), every later connection passes everything (with
 * `afterBytes` Infinity, the first too: a proxy that counts connections).
 */
export async function startSilentProxy(port: number, afterBytes: number): Promise<SilentProxy> {
  let connections = 0;
  let silenced = false;
  const sockets = new Set<Socket>();
  const clients = new Set<Socket>();
  const server = createServer((client) => {
    clients.add(client);
    client.on("close", () => clients.delete(client));
    const first = ++connections === 1;
    const upstream = connect(port, "127.0.0.1");
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("error", () => {
        client.destroy();
        upstream.destroy();
      });
      s.on("close", () => sockets.delete(s));
    }
    client.pipe(upstream);
    let sent = 0;
    upstream.on("data", (chunk: Buffer) => {
      if (!first) return void client.write(chunk);
      if (silenced) return;
      const part = chunk.subarray(0, afterBytes - sent);
      sent += part.length;
      if (part.length > 0) client.write(part);
      if (sent >= afterBytes) silenced = true;
    });
    upstream.on("end", () => {
      if (!first) client.end();
    });
  });
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok));
  const bound = (server.address() as { port: number }).port;
  return {
    hostPort: `127.0.0.1:${bound}`,
    get connections() {
      return connections;
    },
    get silenced() {
      return silenced;
    },
    get open() {
      return clients.size;
    },
    close: () =>
      new Promise<void>((ok) => {
        for (const s of sockets) s.destroy();
        server.close(() => ok());
      }),
  };
}
