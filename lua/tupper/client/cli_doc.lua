--- What the verb table (client/cli_table.lua) becomes for people: the
-- overview of `tupper --help`, each verb's `--help`, and the scdoc source
-- of the tupper(1) man page (`tupper help --scdoc`).
local core = require("tupper.core")
local T = require("tupper.client.cli_table")

local M = {}

M.WIDTH = 78

--- text wrapped to width, each line after the first indented by indent
-- (a string); the first line by first (default indent).
function M.wrap(text, width, indent, first)
  local lines, line = {}, first or indent
  local empty = true
  for word in text:gmatch("%S+") do
    if not empty and #line + 1 + #word > width then
      lines[#lines + 1] = line
      line, empty = indent, true
    end
    line = line .. (empty and "" or " ") .. word
    empty = false
  end
  lines[#lines + 1] = line
  return table.concat(lines, "\n")
end

-- "-e, --env K=V" as an option's left column
local function opt_left(o)
  local s = o.short and ("-" .. o.short) or "  "
  if o.long then s = s .. (o.short and ", " or "  ") .. "--" .. o.long end
  if o.value then s = s .. " " .. o.value end
  return s
end

local function opt_right(o)
  local s = o.summary
  if o.kind == "enum" and not s:find(o.values[1], 1, true) then s = s .. " (" .. table.concat(o.values, ", ") .. ")" end
  if o.repeatable then s = s .. " (repeatable)" end
  return s
end

local function usage_line(v)
  return ("usage: tupper %s%s"):format(v.name, v.synopsis ~= "" and (" " .. v.synopsis) or "")
end

--- The `tupper VERB --help` text of verb entry v.
function M.verb_help(v)
  local out = { usage_line(v), "", M.wrap(v.summary:sub(1, 1):upper() .. v.summary:sub(2) .. ".", M.WIDTH, "") }
  for _, para in ipairs(v.description) do
    out[#out + 1] = ""
    out[#out + 1] = M.wrap(para, M.WIDTH, "")
  end
  if #v.options > 0 then
    out[#out + 1] = ""
    out[#out + 1] = "options:"
    for _, o in ipairs(v.options) do
      local left = "  " .. opt_left(o)
      if #left > 26 then
        out[#out + 1] = left
        out[#out + 1] = M.wrap(opt_right(o), M.WIDTH, (" "):rep(28))
      else
        out[#out + 1] = M.wrap(opt_right(o), M.WIDTH, (" "):rep(28), left .. (" "):rep(28 - #left))
      end
    end
  end
  if #v.examples > 0 then
    out[#out + 1] = ""
    out[#out + 1] = "examples:"
    for _, e in ipairs(v.examples) do
      out[#out + 1] = "  " .. e[1]
      if e[2] ~= "" then out[#out + 1] = "      " .. e[2] end
    end
  end
  return table.concat(out, "\n") .. "\n"
end

--- The help of a group verb ("image"): its sub-verbs.
function M.group_help(name)
  local out = { ("usage: tupper %s COMMAND [ARGS]"):format(name), "", "commands:" }
  for _, v in ipairs(T.subverbs(name)) do
    out[#out + 1] = ("  %-26s%s"):format(v.name:match("%S+$"), v.summary)
  end
  out[#out + 1] = ""
  out[#out + 1] = ("Run 'tupper %s COMMAND --help' for a command's options."):format(name)
  return table.concat(out, "\n") .. "\n"
end

--- The overview: `tupper --help`.
function M.overview()
  local out = { "usage: tupper [--socket PATH] [--state-dir DIR] [--autostart] COMMAND [ARGS]", "",
    "Sandboxes for AI agents, on your own machine." }
  for _, g in ipairs(T.GROUPS) do
    out[#out + 1] = ""
    out[#out + 1] = g[2] .. ":"
    for _, v in ipairs(T.VERBS) do
      if v.group == g[1] and not v.alias then
        out[#out + 1] = M.wrap(v.summary, M.WIDTH, (" "):rep(28), ("  %-26s"):format(v.name))
      end
    end
  end
  out[#out + 1] = ""
  out[#out + 1] = "global options:"
  for _, name in ipairs(T.GLOBAL) do
    local o = T.OPTIONS[name]
    out[#out + 1] = M.wrap(o.summary, M.WIDTH, (" "):rep(28), ("  %-26s"):format(opt_left(o)))
  end
  out[#out + 1] = ""
  out[#out + 1] = M.wrap("Run 'tupper COMMAND --help' (or 'tupper help COMMAND') for a command's options and " ..
    "examples. The client finds the daemon through --socket, $TUPPER_SOCKET or the default socket; when " ..
    "none answers it says how to start one (tupper daemon, or systemctl start tupper.socket), or starts a " ..
    "private one with --autostart or TUPPER_AUTOSTART=1.", M.WIDTH, "")
  return table.concat(out, "\n") .. "\n"
end

-- scdoc's special characters in running text
local function esc(s)
  return (s:gsub("[\\*_]", "\\%0"))
end

-- `code` spans as bold, the rest escaped
local function prose(s)
  local out = {}
  local pos = 1
  while true do
    local a, b, code = s:find("`([^`]+)`", pos)
    if not a then break end
    out[#out + 1] = esc(s:sub(pos, a - 1))
    out[#out + 1] = "*" .. esc(code) .. "*"
    pos = b + 1
  end
  out[#out + 1] = esc(s:sub(pos))
  return table.concat(out)
end

-- a synopsis with its words bold and its metavariables underlined
local function synopsis(s)
  return (s:gsub("[^%s%[%]|%.]+", function(w)
    if w:match("^%-") then return "*" .. esc(w) .. "*" end
    if w:match("^[%u_=:]+$") and w:match("%u") then return "_" .. esc(w) .. "_" end
    return esc(w)
  end):gsub("%.%.%.", "..."))
end

local function scdoc_opt(o)
  local names = {}
  if o.short then names[#names + 1] = "*-" .. o.short .. "*" end
  if o.long then names[#names + 1] = "*--" .. esc(o.long) .. "*" end
  local head = table.concat(names, ", ")
  if o.value then head = head .. " _" .. esc(o.value) .. "_" end
  local s = opt_right(o)
  return head .. "\n\t" .. prose(s:sub(1, 1):upper() .. s:sub(2)) .. ".\n"
end

--- The scdoc source of tupper(1): one section per verb.
function M.scdoc()
  local out = { "tupper(1) \"tupper " .. core.version .. "\"", "",
    "# NAME", "", "tupper - sandboxes for AI agents, on your own machine", "",
    "# SYNOPSIS", "",
    "*tupper* [*--socket* _PATH_] [*--state-dir* _DIR_] [*--autostart*] _COMMAND_ [_ARGS_]", "",
    "*tupper* _COMMAND_ *--help*", "",
    "# DESCRIPTION", "",
    prose("tupper runs commands in sandboxes on this machine: each is a box of its own user, PID, mount, " ..
      "network, IPC and UTS namespaces (or a microVM with its own kernel), with an overlay root made from " ..
      "an image, limits on memory, CPU, processes and disk, and a network that reaches only what a policy " ..
      "allows. One binary is the daemon that owns the sandboxes (tupper-daemon(8)) and the client that " ..
      "talks to it over a Unix socket."), "",
    prose("The client finds the daemon through `--socket`, $TUPPER_SOCKET or the default socket. When " ..
      "none answers, a verb that needs one fails and says how to start it: `tupper daemon &`, or " ..
      "`systemctl start tupper.socket` where the unit is installed. `--autostart` (or TUPPER_AUTOSTART=1) " ..
      "starts a private daemon in the background instead."), "",
    prose("Options of a verb come after it; short flags bundle (`-it` is `-i -t`), a value may follow as the " ..
      "next word or after = (`--memory=1G`), and `--` ends the options."), "",
    "# GLOBAL OPTIONS", "" }
  for _, name in ipairs(T.GLOBAL) do out[#out + 1] = scdoc_opt(T.OPTIONS[name]) end
  out[#out + 1] = "# COMMANDS"
  out[#out + 1] = ""
  for _, v in ipairs(T.VERBS) do
    out[#out + 1] = "## " .. esc(v.name)
    out[#out + 1] = ""
    out[#out + 1] = "*tupper " .. esc(v.name) .. "*" .. (v.synopsis ~= "" and (" " .. synopsis(v.synopsis)) or "")
    out[#out + 1] = ""
    out[#out + 1] = prose(v.summary:sub(1, 1):upper() .. v.summary:sub(2)) .. "."
    for _, para in ipairs(v.description) do
      out[#out + 1] = ""
      out[#out + 1] = prose(para)
    end
    out[#out + 1] = ""
    local shown = 0
    for _, o in ipairs(v.options) do
      if o.key ~= "help" then
        if shown == 0 then out[#out + 1] = "Options:"; out[#out + 1] = "" end
        shown = shown + 1
        out[#out + 1] = scdoc_opt(o)
      end
    end
    if #v.examples > 0 then
      out[#out + 1] = "Examples:"
      out[#out + 1] = ""
      for _, e in ipairs(v.examples) do
        out[#out + 1] = "\t*" .. esc(e[1]) .. "*" .. (e[2] ~= "" and ("\n\t\t" .. esc(e[2])) or "")
        out[#out + 1] = ""
      end
    end
  end
  out[#out + 1] = "# EXIT STATUS"
  out[#out + 1] = ""
  out[#out + 1] = "0 on success. *run* and *exec* exit with the command's code (128+N when signal N ended it, " ..
    "126 when it cannot run, 127 when it is not found). 125 when tupper itself failed: a bad option, no " ..
    "daemon, an error from the daemon. 2 for *tupper* with no command."
  out[#out + 1] = ""
  out[#out + 1] = "# ENVIRONMENT"
  out[#out + 1] = ""
  for _, e in ipairs({
    { "TUPPER_SOCKET", "The daemon's socket, when `--socket` is not given." },
    { "TUPPER_STATE_DIR", "The state directory of a daemon started without `--state-dir`." },
    { "TUPPER_AUTOSTART", "1: start a private daemon when none answers, as `--autostart`." },
    { "XDG_RUNTIME_DIR", "The default socket of a user other than root is $XDG_RUNTIME_DIR/tupper.sock " ..
      "(root's: /run/tupper/tupper.sock)." },
  }) do
    out[#out + 1] = "*" .. esc(e[1]) .. "*"
    out[#out + 1] = "\t" .. prose(e[2])
    out[#out + 1] = ""
  end
  out[#out + 1] = "# SEE ALSO"
  out[#out + 1] = ""
  out[#out + 1] = "*tupper-daemon*(8), *tupper-recipe*(5), *tupper-policy*(5)"
  return table.concat(out, "\n") .. "\n"
end

return M
