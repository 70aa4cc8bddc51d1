-- util/async.lua's wait outside a coroutine: a callback called at once is
-- waited for; one that would come later raises at once, and when it comes
-- it finds the wait gone instead of resuming the main thread (a microVM's
-- metrics sample on the loop's timer did that: "cannot resume
-- non-suspended coroutine").
local uv = require("luv")
local async = require("tupper.util.async")

describe("async.wait", function()
  it("takes a callback called at once outside a coroutine", function()
    local a, b = async.wait(function(cb) cb(1, 2) end)
    assert.are.same({ 1, 2 }, { a, b })
  end)

  it("raises outside a coroutine for a later callback, and ignores that callback", function()
    local later
    local ok, err = pcall(async.wait, function(cb) later = cb end)
    assert.is_false(ok)
    assert.matches("async.wait outside a coroutine", err)
    -- what report() would write if the callback resumed the main thread
    local written = {}
    local stderr = io.stderr
    io.stderr = { write = function(_, ...) for _, s in ipairs({ ... }) do written[#written + 1] = s end end }
    local cok, cerr = pcall(later, "late")
    io.stderr = stderr
    assert.is_true(cok, cerr)
    assert.are.same({}, written)
  end)

  it("waits in a coroutine for a callback from the loop", function()
    local got
    async.spawn(function() got = async.wait(function(cb)
      local t = uv.new_timer()
      t:start(1, 0, function() t:close(); cb("from the loop") end)
    end) end)
    assert.is_nil(got)
    while not got do uv.run("once") end
    assert.are.equal("from the loop", got)
  end)
end)
