-- A general-purpose Python sandbox, as E2B's base image: Debian bookworm
-- built from this host's apt mirror, with python3, pip, git, curl and
-- sudo; commands run as `user` (uid 1000) in /home/user.  Build it once
-- with `tupper build recipes/python.lua` (a few minutes; cached after).
-- sudo is there for parity, but cannot raise privileges in a linux box:
-- boxes run with no_new_privs (docs/images.md, "Debian images").
return recipe "python" {
  image = {
    debian = "bookworm",
    packages = { "ca-certificates", "curl", "git", "python3", "python3-pip", "sudo" },
  },
  env = { LANG = "C.UTF-8", PYTHONUNBUFFERED = "1" },
  workdir = "/home/user",
  user = "user",
}
