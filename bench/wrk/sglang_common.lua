-- SGLang's HiCache API (POST /{rank}/<op>, docs/sglang-api.md) for the wrk scripts:
-- a pool of rank 1, namespace "kv", populated through curl once, before any measured
-- request, with keys [0, count) bound (reserved, then confirmed).
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
local common = require("common")
local M = {}

-- Pages from a reserve answer {"indices":[[false,2],[true,0],...]}, in order.
function M.pages_of(body)
  local pages = {}
  for page in body:gmatch(',(%-?%d+)%]') do pages[#pages + 1] = page end
  return pages
end

function M.populate(rank, pages, count, batch)
  local code = common.post("/" .. rank .. "/initialize", string.format('{"num_pages":%d}', pages))
  assert(code == 204, "sglang initialize answered " .. tostring(code))
  local _, first = common.post("/" .. rank .. "/exists", '{"keys":["' .. common.key(count - 1) .. '"]}')
  if first:find("true") then return end  -- populated by an earlier run
  for start = 0, count - 1, batch do
    local ids = common.ids(start, math.min(batch, count - start))
    local code2, body = common.post("/" .. rank .. "/reserve_and_allocate_page_indices",
                                    '{"keys":' .. common.keys_json(ids, true) .. '}')
    assert(code2 == 200, "populate: reserve answered " .. tostring(code2))
    local got, conf = M.pages_of(body), {}
    for i, id in ipairs(ids) do
      assert(tonumber(got[i]) >= 0, "populate: pool too small")
      conf[i] = '["' .. common.key(id) .. '",' .. got[i] .. ']'
    end
    code2 = common.post("/" .. rank .. "/confirm_write",
                        '{"written_keys_to_confirm":[' .. table.concat(conf, ",") .. ']}')
    assert(code2 == 204, "populate: confirm_write answered " .. tostring(code2))
  end
end

M.keys_total = math.floor(tonumber(os.getenv("METAD_BENCH_KEYS") or "") or 131072)

-- A static POST of 128 keys spread over the pool to /1/<op>, with the pool of rank 1
-- populated by the first thread's setup() (the read scripts).
function M.read_keys(op)
  common.static_post("/1/" .. op,
                     '{"keys":' .. common.keys_json(common.ids(0, 128, 7919, M.keys_total), false) .. '}')
  local populated = false
  setup = function(thread)
    if populated then return end
    populated = true
    M.populate(1, 1048576, M.keys_total, 16384)
  end
  done = common.done
end

return M
