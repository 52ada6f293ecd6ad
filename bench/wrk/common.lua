-- Shared by the wrk scripts: deterministic 32-hex keys, JSON bodies, pre-population
-- through curl (run once, from setup(), before any measured request), and a done()
-- that prints one machine-readable line for scripts/bench.sh.
local M = {}

-- Key `id` as 32 lowercase hex characters (distinct for distinct ids < 2^32; the
-- products stay below 2^53, so double arithmetic is exact).
function M.key(id)
  local a = (id * 2654435761 + 40503) % 4294967296
  local b = (id * 2246822519 + 31337) % 4294967296
  local c = (id * 3266489917 + 17) % 4294967296
  return string.format("%08x%08x%08x%08x", a, b, c, id % 4294967296)
end

-- JSON array of keys (bare strings, or [key, ""] pairs as batch_allocate receives them).
function M.keys_json(ids, pairs)
  local parts = {}
  for i, id in ipairs(ids) do
    parts[i] = pairs and ('["' .. M.key(id) .. '",""]') or ('"' .. M.key(id) .. '"')
  end
  return "[" .. table.concat(parts, ",") .. "]"
end

-- ids first, first + stride, ... (count of them), modulo `wrap` when given.
function M.ids(first, count, stride, wrap)
  local out = {}
  for i = 0, count - 1 do
    local id = first + i * (stride or 1)
    out[i + 1] = wrap and (id % wrap) or id
  end
  return out
end

local function base_url()
  return string.format("http://%s:%s", wrk.host, wrk.port or 80)
end

-- POSTs `body` with curl; returns the status code and the response body.
function M.post(path, body)
  local req, resp = os.tmpname(), os.tmpname()
  local f = assert(io.open(req, "w"))
  f:write(body)
  f:close()
  local cmd = string.format("curl -s -m 120 -o %s -w '%%{http_code}' -H 'Content-Type: application/json' " ..
                            "-H 'Expect:' --data-binary @%s %s%s", resp, req, base_url(), path)
  local p = assert(io.popen(cmd))
  local code = tonumber(p:read("*a"))
  p:close()
  f = io.open(resp, "r")
  local out = f and f:read("*a") or ""
  if f then f:close() end
  os.remove(req)
  os.remove(resp)
  return code, out
end

function M.get(path)
  local p = assert(io.popen(string.format("curl -s -m 10 %s%s", base_url(), path)))
  local out = p:read("*a")
  p:close()
  return out
end

-- Initialises `rank` with `pages` pages (200 also when it already exists, same size).
function M.init_rank(rank, pages)
  local code = M.post("/rank/" .. rank .. "/initialize",
                      string.format('{"num_pages":%d,"role":"worker"}', pages))
  assert(code == 200, "initialize rank " .. rank .. " answered " .. tostring(code))
end

-- Pages from a batch_allocate answer {"rank":r,"results":[["key",page],...]}, in order.
function M.pages_of(body)
  local pages = {}
  for page in body:gmatch('",(%-?%d+)%]') do pages[#pages + 1] = page end
  return pages
end

-- Allocates and confirms keys [0, count) on `rank` (so they are bound and, with one
-- worker rank, complete), in batches. Skipped when the rank already holds them, so a
-- warm-up run pays for it and the measured runs do not.
function M.populate(rank, count, batch)
  local bound = tonumber(M.get("/rank/" .. rank):match('"bound":(%d+)') or "0")
  if bound >= count then return end
  for first = 0, count - 1, batch do
    local ids = M.ids(first, math.min(batch, count - first))
    local code, body = M.post("/keys/batch_allocate",
                              string.format('{"rank":%d,"keys":%s}', rank, M.keys_json(ids, true)))
    assert(code == 200, "populate: batch_allocate answered " .. tostring(code))
    local pages, conf = M.pages_of(body), {}
    for i, id in ipairs(ids) do
      assert(tonumber(pages[i]) >= 0, "populate: pool too small")
      conf[i] = '["' .. M.key(id) .. '",' .. pages[i] .. ']'
    end
    code = M.post("/keys/confirm_write", string.format(
      '{"rank":%d,"confirmations":[%s],"pages_to_release":[]}', rank, table.concat(conf, ",")))
    assert(code == 204, "populate: confirm_write answered " .. tostring(code))
  end
end

-- The ranks the load is spread over: METAD_BENCH_RANKS=n in the environment (the
-- multi-core runs of scripts/bench.sh --scaling), else 1. Rank r belongs to core r mod
-- N, so one rank would send every request to one core.
M.ranks = math.max(math.floor(tonumber(os.getenv("METAD_BENCH_RANKS") or "") or 1), 1)

-- Gives ranks first .. first + ranks - 1 (1M pages each) `count` confirmed keys each,
-- the same keys on every rank; skipped once they hold them. They are the only worker
-- ranks and all are initialised before any confirm, so every key is complete.
function M.populate_ranks(count, first, ranks)
  for r = first, first + ranks - 1 do M.init_rank(r, 1048576) end
  for r = first, first + ranks - 1 do M.populate(r, count, 16384) end
end

-- Gives each wrk thread a rank of its own (first + thread number mod M.ranks) in the
-- global `rank` of its Lua state. Returns a setup() that does that and calls `once()`
-- before the first thread, and an init() that sets the thread's path and body from
-- `post_for(rank)` (wrk's own init calls it, then formats the request once: it stays
-- static).
function M.per_thread_rank(first, post_for, once)
  local next_id = 0
  local function setup(thread)
    if next_id == 0 and once then once() end
    thread:set("rank", first + next_id % M.ranks)
    next_id = next_id + 1
  end
  local function init(args)
    wrk.path, wrk.body = post_for(rank)
  end
  return setup, init
end

-- A static POST: wrk builds the request once and replays it (no per-request Lua).
function M.static_post(path, body)
  wrk.method = "POST"
  wrk.path = path
  wrk.body = body
  wrk.headers["Content-Type"] = "application/json"
end

-- Every response should have `expected` status class: 2xx (default) or 4xx (the
-- invalid-request cases). wrk counts status >= 400 in summary.errors.status.
M.expect_4xx = false

function M.done(summary, latency, requests)
  local e = summary.errors
  local status_bad = M.expect_4xx and (summary.requests - e.status) or e.status
  local bad = status_bad + e.connect + e.read + e.write + e.timeout
  io.write(string.format("METAD_WRK requests=%d duration_us=%d rps=%.1f p50_us=%.1f " ..
                         "p99_us=%.1f bad=%d\n", summary.requests, summary.duration,
                         summary.requests / (summary.duration / 1e6), latency:percentile(50),
                         latency:percentile(99), bad))
end

-- setup() for the scripts that run one stream per thread: numbers the threads (the
-- global `id` in each), keeps them in `threads` for done(), and calls first() once,
-- before any request.
function M.numbered_setup(threads, first)
  local next_id = 0
  return function(thread)
    if next_id == 0 then first() end
    thread:set("id", next_id)
    next_id = next_id + 1
    threads[#threads + 1] = thread
  end
end

-- done() for the scripts whose threads count wrong answers in a global `bad`: adds
-- them to the status errors, then prints as M.done does.
function M.done_counting_bad(threads)
  return function(summary, latency, requests)
    local extra = 0
    for _, t in ipairs(threads) do extra = extra + (t:get("bad") or 0) end
    summary.errors.status = summary.errors.status + extra
    M.done(summary, latency, requests)
  end
end

-- The save pair on the write-failure path, for any API: each wrk thread (run -t N -c N,
-- one strictly alternating stream per thread) sends `first` (a path and body: reserve 128
-- fresh keys of its own), then the release that `second(body)` makes from the answer (a
-- path and body), alternating. first(id) gets the thread's number; ok_first(status,
-- body) and `second_status` check the answers (wrong ones count as errors). Sets the
-- globals setup, init, request, response and done; `once` runs before any request.
function M.alternating_pair(once, first, ok_first, second, second_status)
  local threads = {}
  setup = M.numbered_setup(threads, once)
  local first_req, second_req, phase
  bad = 0
  local json = { ["Content-Type"] = "application/json" }
  init = function(args)
    local path, body = first(id)
    first_req = wrk.format("POST", path, json, body)
    phase = 1
  end
  request = function()
    return phase == 1 and first_req or second_req
  end
  response = function(status, headers, body)
    if phase == 1 then
      if not ok_first(status, body) then bad = bad + 1 end
      local path, release = second(body)
      second_req = wrk.format("POST", path, json, release)
      phase = 2
    else
      if status ~= second_status then bad = bad + 1 end
      phase = 1
    end
  end
  done = M.done_counting_bad(threads)
end

return M
