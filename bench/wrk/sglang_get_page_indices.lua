-- SGLang's get_page_indices of 128 keys on the pool of sglang_exists.lua (every key
-- bound: 128 pages answered, each key moved to the recent end).
package.path = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "?.lua;" .. package.path
require("sglang_common").read_keys("get_page_indices")
