import { describe, expect, it } from "vitest";
import { MAX_QUEUED_STEPS, type ReportedConsumer, type ReportedStep, StepReports } from "../../src/client/step-reports.ts";

const CONSUMER: ReportedConsumer = { dataset: "pile", rank: 0, world: 2, micro_batch: 4 };
const ID = JSON.stringify(CONSUMER);

/** A StepReports whose HTTP reports are recorded (and answered at once, or never). */
function reports(opts: { reportEvery?: number; answer?: boolean; http?: boolean } = {}) {
  let clock = 0;
  const posted: ReportedStep[][] = [];
  const r = new StepReports({
    now: () => clock,
    reportEvery: opts.reportEvery ?? 4,
    reportIntervalMs: 0,
    post: opts.http === false ? undefined : (_c, steps) => {
      posted.push(steps);
      return opts.answer === false ? new Promise(() => {}) : Promise.resolve();
    },
  });
  return { r, posted, tick: (ms: number) => (clock += ms) };
}

describe("StepReports", () => {
  it("sends a step's timings together: the newest two steps wait for the caller's t_h2d and t_compute", async () => {
    const { r, posted } = reports({ reportEvery: 1000 });
    r.begin(ID, CONSUMER);
    for (let s = 0; s < 4; s++) r.waited(ID, s, 0.001 * s);
    for (let s = 0; s < 2; s++) r.add(s, { t_h2d: 0.01, t_compute: 0.2 });
    r.add(2, { t_h2d: 0.01 }); // t_compute of step 2 comes later
    await r.flush();
    // Steps 0 and 1 are complete; 2 and 3 are the newest two and still miss a timing.
    expect(posted.flat().map((s) => s.step)).toEqual([0, 1]);
    expect(posted[0][0]).toEqual({ step: 0, t_wait: 0, t_h2d: 0.01, t_compute: 0.2 });
    expect(r.queuedSteps).toBe(2);
    r.add(2, { t_compute: 0.3 }); // an explicit part: the t_h2d given before stays
    await r.close(); // holds nothing back
    expect(posted.flat().map((s) => s.step)).toEqual([0, 1, 2, 3]);
    expect(posted.flat()[2]).toEqual({ step: 2, t_wait: 0.002, t_h2d: 0.01, t_compute: 0.3 });
    expect(r.queuedSteps).toBe(0);
  });

  it("reports over the consumer's shm socket while it is open, and leaves out a t_wait not measured over HTTP", async () => {
    const { r, posted } = reports({ reportEvery: 1000 });
    r.begin(ID, CONSUMER);
    const overShm: number[] = [];
    const send = (steps: readonly { step: number }[]) => (overShm.push(...steps.map((s) => s.step)), true);
    r.shmSocket(ID, send, true);
    r.waited(ID, 0, 0.5);
    await r.flush();
    expect(overShm).toEqual([0]);
    r.shmSocket(ID, send, false); // closing: nothing queued is left behind for it
    r.add(7, { t_h2d: 0.1 }, { dataset: "pile", rank: 0, world: 2, microBatch: 4 }); // a step never waited for here
    await r.close();
    expect(overShm).toEqual([0]);
    expect(posted).toEqual([[{ step: 7, t_wait: undefined, t_h2d: 0.1 }]]);
  });

  it("stays bounded when reports are not answered, counting the steps it drops", () => {
    const { r, posted } = reports({ answer: false, reportEvery: 1 });
    r.begin(ID, CONSUMER);
    const total = MAX_QUEUED_STEPS * 40;
    for (let s = 0; s < total; s++) {
      r.waited(ID, s, 0.001);
      r.autoFlush(ID);
    }
    expect(posted.length).toBeLessThanOrEqual(33); // one in flight, then one per full queue up to the limit
    expect(r.queuedSteps).toBeLessThanOrEqual(MAX_QUEUED_STEPS);
    expect(r.droppedSteps + r.queuedSteps + posted.flat().length).toBe(total);
    expect(r.droppedSteps).toBeGreaterThan(0);
  });

  it("keeps nothing without HTTP or an shm socket, and refuses a report before any consumer or out of range", () => {
    const { r } = reports({ http: false });
    expect(() => r.add(0, { t_h2d: 0.1 })).toThrow(/before any batches\(\)/);
    r.begin(ID, CONSUMER);
    r.waited(ID, 0, 0.1);
    expect(r.queuedSteps).toBe(0);
    expect(() => r.add(-1, {})).toThrow(/Invalid step: -1/);
    expect(() => r.add(1, { t_compute: -2 })).toThrow(/Invalid t_compute for step 1: -2/);
  });
});
