"""Serve the built Space image without a container engine and check one greedy answer (`make space-smoke`).

The image must carry the repo's current app files (its `specdec.sources` label, `scripts/space_sources.sh`).
Its file system is exported (`podman export`) into a folder, once per image id; its `CMD` runs there in a
chroot as uid 1000 (the Space's user), with the image's environment, on a free local port and 127.0.0.1. The
script waits for the page (timing container start to serving), asks the `generate` API for one greedy answer and
checks that its tokens equal `python -m specdec generate --json` run outside the image on the same prompt, method
and max_new_tokens. The chroot lives in a private mount namespace (`unshare -m`), so its /proc and /dev mounts end
with it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from gradio_client import Client

ROOT = Path(__file__).resolve().parent.parent
# The `generate` endpoint's inputs after the prompt: method, temperature, max_new_tokens, seed, tree, arms,
# lambda_ucb, reward, lookup (off: the CLI's default).
METHOD, MAX_NEW_TOKENS = "mamba-ucb", 24


def podman(*args: str) -> str:
    return subprocess.run(["podman", *args], check=True, capture_output=True, text=True).stdout.strip()


def sources_hash() -> str:
    return subprocess.run(["sh", "scripts/space_sources.sh"], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()


def check_sources(image: str, when: str) -> None:
    """The image must hold the repo's current app files, or the comparison would be between two versions."""
    label = podman("image", "inspect", "--format", '{{index .Labels "specdec.sources"}}', image)
    if label != sources_hash():
        raise SystemExit(f"space-smoke: the repo's app files changed {when}; run `make space-image` again")


def exported_root(image: str, cache: Path) -> Path:
    """The image's file system under `cache/root`, re-exported only when the image id changed."""
    image_id = podman("image", "inspect", "--format", "{{.Id}}", image)
    root, stamp = cache / "root", cache / "root.image-id"
    if stamp.exists() and stamp.read_text() == image_id and root.is_dir():
        return root
    shutil.rmtree(root, ignore_errors=True)
    stamp.unlink(missing_ok=True)
    root.mkdir(parents=True)
    container = podman("create", image)
    try:
        export = subprocess.Popen(["podman", "export", container], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(root)], stdin=export.stdout, check=True)
        if export.wait() != 0:
            raise SystemExit(f"space-smoke: podman export of {image} failed")
    finally:
        podman("rm", container)
    stamp.write_text(image_id)
    return root


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chroot_command(image: str, root: Path, port: int) -> list[str]:
    """The image's CMD in its WORKDIR, as its USER's uid 1000, with its ENV (listening on 127.0.0.1:`port`)."""
    config = json.loads(podman("image", "inspect", "--format", "{{json .Config}}", image))
    env = dict(line.split("=", 1) for line in config.get("Env") or [])
    env.update(HOME="/home/user", SPECDEC_HOST="127.0.0.1", SPECDEC_PORT=str(port), HF_HUB_OFFLINE="1")
    workdir, cmd = config.get("WorkingDir") or "/", config["Cmd"]
    start = f"cd {shlex.quote(workdir)} && exec {shlex.join(cmd)}"
    chroot = ["chroot", "--userspec=1000:1000", str(root), "/usr/bin/env", "-i",
              *(f"{k}={v}" for k, v in env.items()), "/bin/sh", "-c", start]
    proc, dev = shlex.quote(str(root / "proc")), shlex.quote(str(root / "dev"))
    mounts = f"mount -t proc proc {proc} && mount --rbind /dev {dev}"
    return ["unshare", "-m", "sh", "-c", f"{mounts} && exec {shlex.join(chroot)}"]


def wait_for_page(url: str, server: subprocess.Popen, log: Path, seconds: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if server.poll() is not None:
            raise SystemExit(f"space-smoke: the app exited early:\n{log.read_text()[-3000:]}")
        try:
            page = httpx.get(url, timeout=2)
            if page.status_code == 200 and "gradio" in page.text:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise SystemExit(f"space-smoke: no page on {url} within {seconds:.0f} s:\n{log.read_text()[-3000:]}")


def answer_in_image(url: str, prompt: str) -> list[int]:
    """The greedy answer's token ids streamed by the image's `rounds` API, the last event being the summary."""
    events = list(Client(url, verbose=False).submit(prompt, {"method": METHOD, "max_new_tokens": MAX_NEW_TOKENS,
                                                             "lookup": False}, api_name="/rounds"))
    return events[-1]["summary"]["token_ids"]


def answer_outside(prompt: str) -> list[int]:
    out = subprocess.run([sys.executable, "-m", "specdec", "generate", "--prompt", prompt, "--method", METHOD,
                          "--max-new-tokens", str(MAX_NEW_TOKENS), "--json"], cwd=ROOT, check=True,
                         capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])["token_ids"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", default=os.environ.get("SPACE_IMAGE", "localhost/specdec-space:latest"))
    p.add_argument("--cache", type=Path, default=Path(os.environ.get("SPACE_CACHE", "/var/tmp/specdec-space")))
    p.add_argument("--prompt", default="Name three colours.")
    p.add_argument("--start-seconds", type=float, default=60, help="fail when the page takes longer")
    args = p.parse_args()

    started = time.monotonic()
    check_sources(args.image, "since the image was built")
    root = exported_root(args.image, args.cache)
    print(f"space-smoke: image file system at {root} ({time.monotonic() - started:.0f} s)", flush=True)
    port, log = free_port(), args.cache / "app.log"
    url = f"http://127.0.0.1:{port}/"
    with log.open("w") as out:
        server = subprocess.Popen(chroot_command(args.image, root, port), stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        serving = wait_for_page(url, server, log, args.start_seconds)
        print(f"space-smoke: serving on {url} {serving:.1f} s after the start", flush=True)
        ask = time.monotonic()
        inside = answer_in_image(url, args.prompt)
        print(f"space-smoke: the image's greedy answer ({len(inside)} tokens) in {time.monotonic() - ask:.1f} s",
              flush=True)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    outside = answer_outside(args.prompt)
    if inside != outside:
        check_sources(args.image, "during the smoke test")
        raise SystemExit(f"space-smoke: FAILED: the image answered {inside}, the CLI outside it {outside}")
    print(f"space-smoke: OK: {METHOD}, greedy, {MAX_NEW_TOKENS} tokens, identical to the CLI outside the image "
          f"({time.monotonic() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
