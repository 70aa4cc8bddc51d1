-- The default recipe, compiled into the tupper binary: the embedded busybox
-- image, no limits beyond the daemon's defaults, no network.
return recipe "default" {
  image = "default",
}
