-- Prints hyperfine's results as a markdown table of medians, each as a ratio
-- to the first command's (tupper's).
local cjson = require("cjson")
local f = assert(io.open(arg[1]))
local results = cjson.decode(f:read("a")).results
f:close()
local base = results[1].median
print(("| %-8s | %10s | %10s | %13s |"):format("command", "median ms", "mean ms", "ratio to tupper"))
print("|----------|-----------:|-----------:|----------------:|")
for _, r in ipairs(results) do
  print(("| %-8s | %10.2f | %10.2f | %14.2fx |"):format(r.command, r.median * 1000, r.mean * 1000,
    r.median / base))
end
