-- The save pair on the success path with ever-new keys: batch_allocate of 128 keys never
-- seen before, then confirm_write binding all 128, alternating. Rank 1 has POOL_PAGES
-- pages (env, default 8192): once they are bound, every allocation must evict 128 keys
-- (run the server with --eviction lru --read-lease-ms 0), so this measures saves with a
-- full pool. One worker rank, so every confirmed key is complete and evictable. Like
-- alloc_release.lua, run it with -t N -c N: each thread is one strictly alternating
-- stream with its own keys.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("common")

local threads = {}
setup = common.numbered_setup(threads, function()
  common.init_rank(1, tonumber(os.getenv("POOL_PAGES") or "8192"))
end)

local confirm_req, phase, batch
bad = 0
function init(args)
  phase = "allocate"
  batch = 0
end

local function allocate_req()
  -- 2^32 ids per thread (keys are distinct below 2^32 ids; see common.key).
  local ids = common.ids(id * 268435456 + batch * 128, 128)
  batch = batch + 1
  return wrk.format("POST", "/keys/batch_allocate", { ["Content-Type"] = "application/json" },
                    '{"rank":1,"keys":' .. common.keys_json(ids, true) .. '}'), ids
end

local pending_ids
function request()
  if phase == "allocate" then
    local req
    req, pending_ids = allocate_req()
    return req
  end
  return confirm_req
end

function response(status, headers, body)
  if phase == "allocate" then
    local pages = common.pages_of(body)
    if status ~= 200 or #pages ~= 128 or body:find(",%-1%]") then bad = bad + 1 end
    local parts = {}
    for i, page in ipairs(pages) do
      parts[i] = '["' .. common.key(pending_ids[i]) .. '",' .. page .. ']'
    end
    confirm_req = wrk.format("POST", "/keys/confirm_write", { ["Content-Type"] = "application/json" },
                             '{"rank":1,"confirmations":[' .. table.concat(parts, ",") ..
                             '],"pages_to_release":[]}')
    phase = "confirm"
  else
    if status ~= 204 then bad = bad + 1 end
    phase = "allocate"
  end
end

done = common.done_counting_bad(threads)
