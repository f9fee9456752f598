/** @module Budgets held up against the memory the host gives this process, at start-up. */

import type { Config } from "./load.ts";

/** What the budgets say about a memory limit: a refusal (exit 2), a warning, or nothing. */
export interface MemoryCheck {
  readonly refuse?: string;
  readonly warn?: string;
}

const gib = (bytes: number) => `${(bytes / 2 ** 30).toFixed(1)} GiB`;

/**
 * Compares the budgets with the host's memory limit. A memory tier larger than the limit is
 * refused: it fills as data is read, and the kernel kills the server when it gets there, mid-run.
 * Budgets that only add up to more than the limit are a warning: they are ceilings, seldom all
 * reached at once.
 *
 * @param config the loaded configuration
 * @param limit the limit in bytes and where it comes from (see `hostMemoryLimit`); undefined: nothing to check
 */
export function checkMemoryBudgets(config: Config, limit: { readonly bytes: number; readonly source: string } | undefined): MemoryCheck {
  if (!limit) return {};
  const { memoryBytes, batchInflightBytes, objectInflightBytes, batchPoolBytes, shmBytes, datasetIndexBytes } = config;
  if (memoryBytes > limit.bytes) {
    return {
      refuse: `--memory-bytes ${gib(memoryBytes)} exceeds the memory this process may use, ${gib(limit.bytes)} (${limit.source}): ` +
        `the kernel would kill the server once the memory tier fills; lower --memory-bytes (the NVMe tier holds the rest)`,
    };
  }
  const shm = config.shmDir !== undefined ? shmBytes : 0;
  const sum = memoryBytes + batchInflightBytes + objectInflightBytes + batchPoolBytes + shm + datasetIndexBytes;
  if (sum > limit.bytes) {
    return {
      warn: `rackfeed: warning: --memory-bytes ${gib(memoryBytes)} + --batch-inflight-bytes ${gib(batchInflightBytes)} + --object-inflight-bytes ${gib(objectInflightBytes)} + ` +
        `--batch-pool-bytes ${gib(batchPoolBytes)}${shm ? ` + --shm-bytes ${gib(shm)}` : ""} + --dataset-index-bytes ${gib(datasetIndexBytes)} = ${gib(sum)} exceed the memory this process may use, ` +
        `${gib(limit.bytes)} (${limit.source}); under full load the kernel may kill the server: lower some of them`,
    };
  }
  return {};
}
