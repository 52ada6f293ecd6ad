-- get_locations of 128 keys on a rank holding 1M confirmed, complete keys (the same
-- state as batch_exists.lua); every asked key has a page.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("common")

-- METAD_BENCH_KEYS overrides the keys per rank (the multi-core runs use fewer: they
-- populate 8 ranks).
local keys_total = math.floor(tonumber(os.getenv("METAD_BENCH_KEYS") or "") or 1000000)
local ids_json = common.keys_json(common.ids(0, 128, 7919, keys_total), false)
local function post_for(rank)
  return "/keys/get_locations", '{"rank":' .. rank .. ',"keys":' .. ids_json .. '}'
end
common.static_post(post_for(1))

-- Ranks 1 .. METAD_BENCH_RANKS, one per wrk thread, each holding the same keys.
setup, init = common.per_thread_rank(1, post_for, function()
  common.populate_ranks(keys_total, 1, common.ranks)
end)

done = common.done
