-- A general-purpose Python sandbox, as E2B's base image: Debian bookworm
-- built from this host's apt mirror, with python3, pip, git and curl;
-- commands run as `user` (uid 1000) in /home/user.  The first use builds
-- the image (minutes; cached after).  No sudo: a linux box has no
-- capabilities and no_new_privs, so it could not work (docs/images.md).
return recipe "python" {
  image = {
    debian = "bookworm",
    packages = { "ca-certificates", "curl", "git", "python3", "python3-pip" },
  },
  env = { LANG = "C.UTF-8", PYTHONUNBUFFERED = "1" },
  workdir = "/home/user",
  user = "user",
}
