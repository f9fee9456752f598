import { readFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeWorkspace, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";

let ws: Workspace;
let rf: RunningServer;
beforeAll(async () => {
  ws = await makeWorkspace();
  rf = await startServer(ws);
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

describe("grafana/rackfeed.json", () => {
  it("queries only metrics the server exposes (so the dashboard stays in step with /metrics)", async () => {
    const dash = JSON.parse(readFileSync(new URL("../../grafana/rackfeed.json", import.meta.url), "utf8"));
    const exposed = new Set(
      [...(await (await fetch(`${rf.url}/metrics`)).text()).matchAll(/^# TYPE (\w+) (\w+)/gm)].flatMap((m) =>
        m[2] === "histogram" ? [`${m[1]}_bucket`, `${m[1]}_sum`, `${m[1]}_count`] : [m[1]]
      ),
    );
    const used = new Set<string>();
    for (const p of dash.panels) {
      for (const t of p.targets) for (const m of t.expr.matchAll(/\brackfeed_\w+/g)) used.add(m[0]);
    }
    expect(used.size).toBeGreaterThan(10);
    expect([...used].filter((m) => !exposed.has(m))).toEqual([]);
  });
});
