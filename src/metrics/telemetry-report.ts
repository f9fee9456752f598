/**
 * @module The limits of `POST /v1/telemetry` that both ends must agree on: the route refuses a
 * larger report, and the SDK splits what it has queued to fit. Web standards only (the SDK imports it).
 */

/** Most steps in one report. */
export const MAX_REPORT_STEPS = 10_000;
