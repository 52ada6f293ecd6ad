-- Valid initialize (a worker re-initialising its rank with the same size: 200, no
-- change) — the trivial endpoint compared with nginx's fixed `return 200`.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("common")

common.static_post("/rank/0/initialize", '{"num_pages":1024,"role":"worker"}')

local ready = false
function setup(thread)
  -- nginx (the yardstick) answers this too, so the same script drives both.
  if not ready then common.post("/rank/0/initialize", wrk.body) end
  ready = true
end

done = common.done
