-- Invalid initialize (misspelled role): the precomputed 400 — every response must be it.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("common")

common.static_post("/rank/0/initialize", '{"num_pages":1024,"role":"wroker"}')
common.expect_4xx = true

done = common.done
