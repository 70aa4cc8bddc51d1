-- Alpine Linux from Docker Hub, pulled into the image store on first use
-- (docs/images.md): a small musl userland with busybox and apk.  apk needs
-- the network: give the recipe rules (network = { allow = {
-- "dl-cdn.alpinelinux.org:443" } }) and install in setup.
return recipe "alpine" {
  image = "docker.io/library/alpine:3.20",
  env = { LANG = "C.UTF-8" },
  workdir = "/root",
}
