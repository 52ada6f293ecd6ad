-- get_locations of 128 keys on a rank holding 1M confirmed, complete keys (the same
-- state as batch_exists.lua); every asked key has a page.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("common")

local keys_total = 1000000
common.static_post("/keys/get_locations",
                   '{"rank":1,"keys":' .. common.keys_json(common.ids(0, 128, 7919, keys_total), false) .. '}')

setup = common.populated_rank_setup(keys_total)

done = common.done
