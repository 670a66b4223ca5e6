#!/bin/sh
# Build the Space's image from the repo's Dockerfile with podman, on a machine with no Docker engine and no
# reachable container registry (`make space-image`). Two substitutions, both passed as build arguments:
#   - the base: a Debian bookworm root made here with debootstrap (python3 + python3-venv), imported once as
#     $SPACE_BASE instead of the public python:3.11-slim; it carries this machine's CA bundle ($HOST_CA) as pip's
#     `cert` in /etc/pip.conf, since PyPI is reached here through a proxy with its own certificate authority;
#   - torch: the CPU wheel of requirements.txt's version, found by this machine's pip (`pip download`, which
#     here reads /opt/wheels), mounted into the build at /wheels instead of the download.pytorch.org CPU index.
# Idempotent: the base is built only when missing, the wheel fetched only once, and podman's layer cache makes
# a rebuild of an unchanged tree quick. Caches live in $SPACE_CACHE, outside the repo.
set -eu

CACHE=${SPACE_CACHE:-/var/tmp/specdec-space}
BASE=${SPACE_BASE:-localhost/specdec-base:bookworm}
IMAGE=${SPACE_IMAGE:-localhost/specdec-space:latest}
PY=${PY:-.venv/bin/python}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
HOST_CA=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}

for tool in podman debootstrap; do
    command -v "$tool" >/dev/null \
        || { echo "space-image: $tool is missing (apt-get install podman debootstrap)" >&2; exit 1; }
done
mkdir -p "$CACHE"

if ! podman image exists "$BASE"; then
    echo "space-image: building the base $BASE with debootstrap (once)"
    rm -rf "$CACHE/rootfs"
    nice -n 10 debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm \
        "$CACHE/rootfs" "$MIRROR"
    rm -rf "$CACHE/rootfs/var/cache/apt/archives/"*.deb "$CACHE/rootfs/var/lib/apt/lists/"*
    cp "$HOST_CA" "$CACHE/rootfs/etc/ssl/certs/host-ca-bundle.crt"
    printf '[global]\ncert = /etc/ssl/certs/host-ca-bundle.crt\n' > "$CACHE/rootfs/etc/pip.conf"
    tar -C "$CACHE/rootfs" -c . | podman import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' - "$BASE"
    rm -rf "$CACHE/rootfs"
fi

version=$(sed -n 's/^torch==//p' requirements.txt)
wheels="$CACHE/wheels"
if ! ls "$wheels/torch-$version+cpu-"*.whl >/dev/null 2>&1; then
    rm -rf "$wheels" && mkdir -p "$wheels"
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$wheels" "torch==$version"
fi
if ! ls "$wheels/torch-$version+cpu-"*.whl >/dev/null 2>&1; then
    echo "space-image: pip found no CPU build of torch $version ($(ls "$wheels")); put one in $wheels" >&2
    exit 1
fi

start=$(date +%s)
nice -n 10 podman build --isolation chroot --layers \
    --build-arg BASE_IMAGE="$BASE" \
    --build-arg TORCH_PIP_ARGS="--no-index --no-deps --find-links /wheels" \
    --volume "$wheels:/wheels:ro" \
    --label specdec.sources="$(sh scripts/space_sources.sh)" \
    --tag "$IMAGE" .
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "space-image: $IMAGE built in $(($(date +%s) - start)) s; size $((size / 1000000)) MB ($size bytes)"
