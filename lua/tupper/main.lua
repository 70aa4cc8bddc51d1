--- Entry point of the tupper binary: returns the function the C host calls
-- with argv; its result is the exit code.
return function(argv)
  return require("tupper.cli").main(argv)
end
