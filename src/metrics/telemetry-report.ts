/**
 * @module The limits of step-timing reports that both ends must agree on (`POST /v1/telemetry`
 * and the shm `timings` message): the server refuses a larger report or a timing out of range,
 * and the SDK keeps within them. Web standards only (the SDK imports it).
 */

/** Most steps in one report. */
export const MAX_REPORT_STEPS = 10_000;

/** Most seconds a timing may hold (a report with more, or a negative one, is refused). */
export const MAX_TIMING_SECONDS = 86_400;

/** One step's timings, as reported (over HTTP or in a shm `timings` message); a NaN t_wait was not measured. */
export interface StepTimings {
  readonly step: number;
  readonly t_wait: number;
  readonly t_h2d?: number;
  readonly t_compute?: number;
}
