-- wrk script for bench/objects: each thread cycles through the paths given after `--`
-- (thread i starts at offset i, so threads do not march in lock-step), and `done` prints
-- one machine-readable line, `BENCHJSON {...}`, that report.mjs parses.
-- No response() callback on purpose: defining one makes wrk buffer every body.

local paths = {}
local idx = 0
local counter = 0

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
end

function init(args)
  for i = 1, #args do paths[#paths + 1] = args[i] end
  if #paths == 0 then error("rotate.lua: give the object paths after --") end
  idx = (tid or 0) % #paths
end

function request()
  idx = idx % #paths + 1
  return wrk.format("GET", paths[idx])
end

function done(summary, latency, requests)
  local e = summary.errors
  local secs = summary.duration / 1e6
  io.write(string.format(
    'BENCHJSON {"requests":%d,"duration_s":%.6f,"bytes":%d,"rps":%.3f,' ..
    '"lat_us":{"p50":%d,"p90":%d,"p99":%d,"max":%d,"mean":%.1f},' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}}\n',
    summary.requests, secs, summary.bytes, summary.requests / secs,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean,
    e.connect, e.read, e.write, e.status, e.timeout))
end
