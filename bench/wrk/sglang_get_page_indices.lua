-- SGLang's get_page_indices of 128 keys on the pool of sglang_exists.lua (every key
-- bound: 128 pages answered, each key moved to the recent end).
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("common")
local sglang = require("sglang_common")

common.static_post("/1/get_page_indices",
                   '{"keys":' .. common.keys_json(common.ids(0, 128, 7919, sglang.keys_total), false) .. '}')
local populated = false
function setup(thread)
  if populated then return end
  populated = true
  sglang.populate(1, 1048576, sglang.keys_total, 16384)
end
done = common.done
