-- SGLang's exists of 128 keys on a pool of rank 1 holding METAD_BENCH_KEYS (131,072)
-- bound keys; every asked key is bound. Compare with get_locations.lua.
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
require("sglang_common").read_keys("exists")
