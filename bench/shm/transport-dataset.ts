/** @module The token dataset of bench/transport and bench/gpu: ~13 M uint16 tokens (26 MB, all of it cached after one pass), seq_length 4096, enough samples for 1 MiB and 8 MiB batches. */

import { writeFile } from "node:fs/promises";
import type { Workspace } from "../../test/helpers/rackfeed.ts";
import { syntheticDataset } from "../../test/helpers/token-data.ts";

/**
 * Writes the dataset into the workspace's origin (`data/tok/d`) and its registration beside it.
 *
 * @returns the registration file, for `--dataset d=FILE`
 */
export async function writeTransportDataset(ws: Workspace): Promise<string> {
  const { idx, bin } = syntheticDataset(4000, 500, 6000, 3);
  await ws.put("tok/d.idx", idx);
  await ws.put("tok/d.bin", bin);
  const file = `${ws.dir}/d.json`;
  await writeFile(file, JSON.stringify({ sources: [{ prefix: "data/tok/d" }], seq_length: 4096, seed: 1, split: "100,0,0", split_index: 0, num_samples: 160_000 }));
  return file;
}
