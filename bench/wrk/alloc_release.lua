-- The realistic save pair on the write-failure path: batch_allocate of 128 fresh keys
-- (reserves 128 pages), then confirm_write with no confirmations and those 128 pages in
-- pages_to_release (frees them and drops the reservations), alternating. wrk's Lua sees
-- requests per thread, not per connection, so run it with as many threads as
-- connections (-t N -c N): each thread is then one strictly alternating stream. Each
-- thread uses its own keys. Rank 1, 1M pages.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("common")

common.alternating_pair(
  function() common.init_rank(1, 1048576) end,
  function(id)
    local ids = common.ids((id + 1) * 1000000, 128)
    return "/keys/batch_allocate", '{"rank":1,"keys":' .. common.keys_json(ids, true) .. '}'
  end,
  function(status, body) return status == 200 and #common.pages_of(body) == 128 end,
  function(body)
    return "/keys/confirm_write", '{"rank":1,"confirmations":[],"pages_to_release":[' ..
                                  table.concat(common.pages_of(body), ",") .. ']}'
  end,
  204)
