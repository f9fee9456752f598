/*
 * rackfeed's gather: copies a batch's pieces out of cached blocks into its body (or a shared-memory
 * slot) with memcpy, called through FFI (koffi on Node, Deno.dlopen on Deno). A JavaScript copy
 * loop pays a typed-array view and a runtime call per piece and reaches about half of memcpy's
 * speed on pieces of a few KiB; a large batch is also cut into slices copied on several threads.
 * Build: scripts/build-native.mjs (cc -O2 -shared -fPIC), output native/build/librackfeed.so.
 */
#include <stdint.h>
#include <string.h>

/* The address of a buffer's first byte, as a double: user-space addresses (< 2^47) are exact. */
double rackfeed_address(const void *p) { return (double)(uintptr_t)p; }

/*
 * Copies pieces [first, end): piece i is three doubles, (source address, bytes, offset in dst).
 * Returns the bytes copied (a double, exact below 2^53); the caller checks them against the batch.
 */
double rackfeed_gather(uint8_t *dst, const double *pieces, int32_t first, int32_t end) {
  double total = 0;
  for (int32_t i = first; i < end; i++) {
    const uint8_t *src = (const uint8_t *)(uintptr_t)pieces[3 * i];
    size_t bytes = (size_t)pieces[3 * i + 1];
    memcpy(dst + (size_t)pieces[3 * i + 2], src, bytes);
    total += (double)bytes;
  }
  return total;
}
