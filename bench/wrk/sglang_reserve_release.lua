-- SGLang's save pair on the write-failure path, as alloc_release.lua for vLLM's API:
-- reserve_and_allocate_page_indices of 128 fresh keys, then confirm_write with nothing
-- to confirm and those 128 pages released, alternating. Run with -t N -c N (one
-- strictly alternating stream per thread); each thread its own keys; rank 2, 1M pages.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("common")
local sglang = require("sglang_common")

common.alternating_pair(
  function()
    local code = common.post("/2/initialize", '{"num_pages":1048576}')
    assert(code == 204, "sglang initialize answered " .. tostring(code))
  end,
  function(id)
    local ids = common.ids((id + 1) * 1000000, 128)
    return "/2/reserve_and_allocate_page_indices", '{"keys":' .. common.keys_json(ids, true) .. '}'
  end,
  function(status, body) return status == 200 and #sglang.pages_of(body) == 128 end,
  function(body)
    return "/2/confirm_write", '{"written_keys_to_confirm":[],"pages_to_release":[' ..
                               table.concat(sglang.pages_of(body), ",") .. ']}'
  end,
  204)
