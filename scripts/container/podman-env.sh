# Sourced by the container scripts: podman as these machines need it (runc, cgroupfs, no default ulimits),
# through a containers.conf of its own so that nothing under /etc is changed.
COUNTERSIGN_PODMAN_CONF="${TMPDIR:-/tmp}/countersign-containers.conf"
cat >"$COUNTERSIGN_PODMAN_CONF" <<'CONF'
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
export CONTAINERS_CONF="$COUNTERSIGN_PODMAN_CONF"
