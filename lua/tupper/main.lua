--- Entry point of the tupper binary: returns the function the C host calls
-- with argv; its result is the exit code.
return function(argv)
  return require("tupper.client.cli").main(argv) -- the entry: runs when the host calls it, not at load
end
