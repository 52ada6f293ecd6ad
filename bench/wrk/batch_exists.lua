-- batch_exists of 1,250 keys (~44 KB: a 20k-token prompt) against a directory of 1M
-- complete keys (rank 1 confirmed all of them; it is the only worker rank, so each is
-- complete). The asked keys are spread over the 1M and all exist.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("common")

local keys_total = 1000000
common.static_post("/keys/batch_exists",
                   '{"keys":' .. common.keys_json(common.ids(0, 1250, 797, keys_total), false) .. '}')

local ready = false
function setup(thread)
  if not ready then common.populate_ranks(keys_total, 1, 1) end
  ready = true
end

done = common.done
