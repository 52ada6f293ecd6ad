-- SGLang's save pair on the write-failure path, as alloc_release.lua for vLLM's API:
-- reserve_and_allocate_page_indices of 128 fresh keys, then confirm_write with nothing
-- to confirm and those 128 pages released, alternating. Run with -t N -c N (one
-- strictly alternating stream per thread); each thread its own keys; rank 2, 1M pages.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("common")
local sglang = require("sglang_common")

local threads = {}
setup = common.numbered_setup(threads, function()
  local code = common.post("/2/initialize", '{"num_pages":1048576}')
  assert(code == 204, "sglang initialize answered " .. tostring(code))
end)

local reserve_req, release_req, phase
bad = 0
function init(args)
  local ids = common.ids((id + 1) * 1000000, 128)
  reserve_req = wrk.format("POST", "/2/reserve_and_allocate_page_indices",
                           { ["Content-Type"] = "application/json" },
                           '{"keys":' .. common.keys_json(ids, true) .. '}')
  phase = "reserve"
end

function request()
  if phase == "reserve" then return reserve_req end
  return release_req
end

function response(status, headers, body)
  if phase == "reserve" then
    local pages = sglang.pages_of(body)
    if status ~= 200 or #pages ~= 128 then bad = bad + 1 end
    release_req = wrk.format("POST", "/2/confirm_write", { ["Content-Type"] = "application/json" },
                             '{"written_keys_to_confirm":[],"pages_to_release":[' ..
                             table.concat(pages, ",") .. ']}')
    phase = "release"
  else
    if status ~= 204 then bad = bad + 1 end
    phase = "reserve"
  end
end

done = common.done_counting_bad(threads)
