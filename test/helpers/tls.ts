/** @module A self-signed certificate for 127.0.0.1, made by openssl, for the TLS servers of tests. */

import { execFileSync } from "node:child_process";
import { join } from "node:path";

/**
 * Writes `<name>-key.pem` and `<name>-cert.pem` under `dir`: a self-signed RSA-2048 certificate
 * for the IP 127.0.0.1, valid for a day; with `endEntity`, marked CA:FALSE (as Deno's client wants it).
 *
 * @returns the two files' paths
 */
export function selfSignedCert(dir: string, name: string, opts: { endEntity?: boolean } = {}): { key: string; cert: string } {
  const key = join(dir, `${name}-key.pem`);
  const cert = join(dir, `${name}-cert.pem`);
  execFileSync("openssl", [
    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
    // rustls (Deno's fetch) refuses a server certificate marked CA:TRUE, openssl's default.
    ...(opts.endEntity ? ["-addext", "basicConstraints=critical,CA:FALSE"] : []),
  ], { stdio: "ignore" });
  return { key, cert };
}
