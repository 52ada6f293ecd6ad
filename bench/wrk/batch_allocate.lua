-- batch_allocate of 128 keys the rank already confirmed: the cache-hit answer (no page
-- is taken), the steady state of a warm cache. Rank 1, 1,024 pages.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("common")

common.static_post("/keys/batch_allocate",
                   '{"rank":1,"keys":' .. common.keys_json(common.ids(0, 128), true) .. '}')

local ready = false
function setup(thread)
  if ready then return end
  ready = true
  common.init_rank(1, 1024)
  common.populate(1, 128, 128)
end

done = common.done
