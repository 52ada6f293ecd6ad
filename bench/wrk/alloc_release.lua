-- The realistic save pair on the write-failure path: batch_allocate of 128 fresh keys
-- (reserves 128 pages), then confirm_write with no confirmations and those 128 pages in
-- pages_to_release (frees them and drops the reservations), alternating. wrk's Lua sees
-- requests per thread, not per connection, so run it with as many threads as
-- connections (-t N -c N): each thread is then one strictly alternating stream. Each
-- thread uses its own keys. Rank 1, 1M pages.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("common")

local threads = {}
setup = common.numbered_setup(threads, function() common.init_rank(1, 1048576) end)

local allocate_req, release_req, phase
bad = 0
function init(args)
  local ids = common.ids((id + 1) * 1000000, 128)
  allocate_req = wrk.format("POST", "/keys/batch_allocate", { ["Content-Type"] = "application/json" },
                            '{"rank":1,"keys":' .. common.keys_json(ids, true) .. '}')
  phase = "allocate"
end

function request()
  if phase == "allocate" then return allocate_req end
  return release_req
end

function response(status, headers, body)
  if phase == "allocate" then
    local pages = common.pages_of(body)
    if status ~= 200 or #pages ~= 128 then bad = bad + 1 end
    release_req = wrk.format("POST", "/keys/confirm_write", { ["Content-Type"] = "application/json" },
                             '{"rank":1,"confirmations":[],"pages_to_release":[' ..
                             table.concat(pages, ",") .. ']}')
    phase = "release"
  else
    if status ~= 204 then bad = bad + 1 end
    phase = "allocate"
  end
end

done = common.done_counting_bad(threads)
