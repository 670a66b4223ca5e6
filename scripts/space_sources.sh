#!/bin/sh
# One hash of what the Space image copies from the repo (the Dockerfile's COPY sources, without bytecode):
# `make space-image` labels the image with it and `make space-smoke` refuses an image built from other sources.
set -eu
find requirements.txt app.py specdec demo assets -type f ! -name '*.pyc' -print0 | LC_ALL=C sort -z \
    | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
