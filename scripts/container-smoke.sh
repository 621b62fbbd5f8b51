#!/usr/bin/env bash
# The image and the three-replica stack, tested on this machine (README.md, "Operations"): builds a
# local base (scripts/container/base.sh, cached), the countersign image from the Containerfile on it,
# PostgreSQL and HAProxy images from Debian's packages, starts compose.yaml with podman-compose,
# runs the acceptance smoke (scripts/container/smoke.ts) through the balancer with one replica stopped
# halfway, checks the refusal of a data directory it cannot write, and scans every layer of the image
# for the secrets the stack made. Needs root; installs podman, runc, debootstrap and podman-compose
# from Debian when they are missing.
#
#   scripts/container-smoke.sh            # KEEP=1 leaves the stack running
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
say() { echo "== container smoke ($((SECONDS - started)) s): $*"; }

need=()
for tool in podman runc debootstrap podman-compose; do command -v "$tool" >/dev/null || need+=("$tool"); done
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap podman-compose >/dev/null
fi
# shellcheck source=container/podman-env.sh
. scripts/container/podman-env.sh

base="$(scripts/container/base.sh)"
say "base $base"

# PostgreSQL and HAProxy from Debian's packages: cached under a tag naming their files' digest.
local_image() { # name, Containerfile
  local digest tag
  digest="$(cat "$2" scripts/container/postgres-entrypoint.sh | sha256sum | cut -c1-12)"
  tag="localhost/countersign-smoke-$1:$digest"
  if ! podman image exists "$tag"; then
    podman build -q --format docker --network host --build-arg "BASE_IMAGE=$base" -t "$tag" \
      -f "$2" scripts/container >/dev/null 2>&1 || { echo "building $tag failed" >&2; exit 1; }
  fi
  echo "$tag"
}
postgres_image="$(local_image postgres scripts/container/postgres.Containerfile)"
balancer_image="$(local_image haproxy scripts/container/haproxy.Containerfile)"
say "postgres $postgres_image, balancer $balancer_image"

image=localhost/countersign:smoke
build_log="$(mktemp)"
podman build -q --format docker --network host --build-arg "BASE_IMAGE=$base" -t "$image" -f Containerfile . >"$build_log" 2>&1 ||
  { cat "$build_log"; exit 1; }
rm -f "$build_log"
say "image $image: $(podman image inspect "$image" --format '{{.Size}}' | awk '{printf "%d MB", $1 / 1000000}'), user $(podman image inspect "$image" --format '{{.Config.User}}')"

# A data directory the image's user cannot write: a clear refusal and exit 1.
ro="$(mktemp -d)"
chmod 0755 "$ro"
set +e
refusal="$(podman run --rm -v "$ro:/var/lib/countersign" "$image" 2>&1)"
code=$?
set -e
rmdir "$ro"
if [ "$code" != 1 ] || ! grep -q 'configuration error: the data directory /var/lib/countersign .* not writable' <<<"$refusal"; then
  echo "expected a refusal of the unwritable data directory with exit 1, got exit $code:"
  echo "$refusal"
  exit 1
fi
say "unwritable data directory refused (exit 1)"

project="countersign-smoke-$$"
port="$(node -e "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})")"
export COUNTERSIGN_IMAGE="$image" COUNTERSIGN_POSTGRES_IMAGE="$postgres_image" \
  COUNTERSIGN_BALANCER_IMAGE="$balancer_image" COUNTERSIGN_HTTP_PORT="$port"
compose() { podman-compose -p "$project" -f compose.yaml "$@"; }
logs="$(mktemp -d)"
finish() {
  local status=$?
  if [ "$status" != 0 ]; then
    for c in $(podman ps -a --filter "label=io.podman.compose.project=$project" --format '{{.Names}}'); do
      echo "--- $c"
      podman logs --tail 40 "$c" 2>&1 || true
    done
  fi
  if [ -z "${KEEP:-}" ]; then
    compose down -v >/dev/null 2>&1 || true
    podman volume ls -q | grep "^${project}_" | xargs -r podman volume rm -f >/dev/null 2>&1 || true
  fi
  rm -rf "$logs"
  exit "$status"
}
trap finish EXIT
compose up -d >"$logs/up.log" 2>&1 || { cat "$logs/up.log"; exit 1; }
say "stack $project up, balancer on 127.0.0.1:$port"

replicas=()
for n in 1 2 3; do replicas+=("${project}_countersign-${n}_1"); done
for _ in $(seq 1 150); do
  ready=0
  for r in "${replicas[@]}"; do
    podman exec "$r" node /opt/countersign/bin/healthcheck.js 2>/dev/null && ready=$((ready + 1))
  done
  [ "$ready" = 3 ] && curl_ok="$(node -e "fetch('http://127.0.0.1:$port/healthz').then(r=>console.log(r.status),()=>console.log(0))")" &&
    [ "$curl_ok" = 200 ] && break
  sleep 1
done
[ "$ready" = 3 ] || { echo "not every replica became ready"; exit 1; }
say "three replicas ready behind the balancer"

node --import tsx scripts/container/smoke.ts "http://127.0.0.1:$port" "${replicas[@]}" >"$logs/secrets"

# The secrets this stack made, looked for in every layer of the image (a file removed by a later layer
# is still in an earlier one), with files that look like secrets by their names.
shared="$(podman volume inspect "${project}_shared" --format '{{.Mountpoint}}')"
find "$shared" -type f -exec cat {} + | tr -s ' ,"{}' '\n' | grep -v -e '^-----' |
  sed 's/^postgres:\/\///' | awk 'length >= 16' >>"$logs/secrets"
podman save -q --format docker-archive -o "$logs/image.tar" "$image" >/dev/null
mkdir "$logs/image"
tar -xf "$logs/image.tar" -C "$logs/image"
layers=0
while IFS= read -r layer; do
  layers=$((layers + 1))
  if tar -xOf "$layer" | grep -a -q -F -f "$logs/secrets"; then
    echo "a secret of the stack is in the image layer $layer"
    exit 1
  fi
  if tar -tf "$layer" | grep -E '(^|/)(audit-signing-key\.pem|host-roots\.json|database-url|db-password|countersign\.config\.json|\.npmrc|\.env)$|^(var/lib/countersign|etc/countersign/shared)/.'; then
    echo "a file that holds secrets is in the image layer $layer"
    exit 1
  fi
done < <(find "$logs/image" -type f -name '*.tar')
say "no secret in the image's $layers layers ($(wc -l <"$logs/secrets") values looked for)"
say "passed"
