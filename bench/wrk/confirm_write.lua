-- confirm_write of 128 (key, page) pairs the rank already bound: a valid no-op 204
-- (confirm must name pages batch_allocate reserved, so a repeatable confirm is one that
-- re-confirms). The first run binds keys 0..127 to pages 0..127 on a fresh rank 1.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("common")

local pairs_json = {}
for i = 0, 127 do pairs_json[i + 1] = '["' .. common.key(i) .. '",' .. i .. ']' end
common.static_post("/keys/confirm_write", '{"rank":1,"confirmations":[' ..
                   table.concat(pairs_json, ",") .. '],"pages_to_release":[]}')

local ready = false
function setup(thread)
  if ready then return end
  ready = true
  common.init_rank(1, 1024)
  common.populate(1, 128, 128)
  -- populate() takes the lowest free pages, in key order: key i holds page i.
  local code = common.post(wrk.path, wrk.body)
  assert(code == 204, "confirm_write setup check answered " .. tostring(code))
end

done = common.done
