-- Valid initialize (a worker re-initialising its rank with the same size: 200, no
-- change) — the trivial endpoint compared with nginx's fixed `return 200`.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("common")

local function post_for(rank)
  return "/rank/" .. rank .. "/initialize", '{"num_pages":1024,"role":"worker"}'
end
common.static_post(post_for(0))

-- Ranks 0 .. METAD_BENCH_RANKS-1, one per wrk thread. nginx (the yardstick) answers this too, so the
-- same script drives both.
setup, init = common.per_thread_rank(0, post_for, function()
  for r = 0, common.ranks - 1 do common.post(post_for(r)) end
end)

done = common.done
