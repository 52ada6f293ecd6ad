-- SGLang's exists of 128 keys on a pool of rank 1 holding METAD_BENCH_KEYS (131,072)
-- bound keys; every asked key is bound. Compare with batch_exists.lua / get_locations.lua.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("common")
local sglang = require("sglang_common")

common.static_post("/1/exists",
                   '{"keys":' .. common.keys_json(common.ids(0, 128, 7919, sglang.keys_total), false) .. '}')
local populated = false
function setup(thread)
  if populated then return end
  populated = true
  sglang.populate(1, 1048576, sglang.keys_total, 16384)
end
done = common.done
