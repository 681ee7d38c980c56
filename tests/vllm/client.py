#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Stdlib-only client helpers for the ecx vLLM tests (urllib + json, no requests).

    import client
    client.wait_health("http://127.0.0.1:8100", timeout=300, proc=popen_or_pid)
    r = client.chat_image("http://127.0.0.1:8100", model="tiny", max_tokens=12,
                          ec_transfer_params={...}, uuid="img-1")
    r["text"], r["token_ids"], r["ec_transfer_params"], r["raw"]

CLI (prints the result as one JSON line):
    python client.py health URL [--timeout S] [--pid PID]
    python client.py chat URL [--model tiny] [--max-tokens N] [--uuid U]
                     [--ec-transfer-params JSON] [--image-seed N] [--prompt TEXT]
    python client.py png OUT.png [--image-seed N]

The image is a deterministic 112x112 RGB PNG made in-process with zlib (no PIL
needed), sent as a data: URL in an OpenAI image_url content part.
"""
import argparse
import base64
import json
import os
import struct
import sys
import time
import urllib.error
import urllib.request
import zlib

DEFAULT_PROMPT = "Describe the image in detail."


# ---------------------------------------------------------------- image
def make_png(width=112, height=112, seed=0):
    """Deterministic RGB PNG bytes: a seed-dependent pattern of colour blocks and
    gradients (strong structure, so the vision tower's output depends on it)."""
    rows = []
    s = (seed * 2654435761 + 12345) & 0xFFFFFFFF
    # 4x4 blocks of pseudo-random colours, plus a diagonal gradient
    blocks = []
    for _ in range(16):
        s = (s * 1103515245 + 12345) & 0x7FFFFFFF
        blocks.append(((s >> 4) & 255, (s >> 12) & 255, (s >> 20) & 255))
    bw, bh = max(1, width // 4), max(1, height // 4)
    for y in range(height):
        row = bytearray([0])  # filter type 0
        for x in range(width):
            r, g, b = blocks[min(3, y // bh) * 4 + min(3, x // bw)]
            d = (x + y) * 255 // max(1, width + height - 2)
            row += bytes(((r + d) // 2, (g + 255 - d) // 2, (b ^ (x * 7 + y * 3)) & 255))
        rows.append(bytes(row))
    raw = b"".join(rows)

    def chunk(tag, data):
        c = struct.pack(">I", len(data)) + tag + data
        return c + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def png_data_url(png_bytes):
    return "data:image/png;base64," + base64.b64encode(png_bytes).decode("ascii")


# ---------------------------------------------------------------- http
def _request(url, body=None, timeout=60.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _pid_alive(proc):
    if proc is None:
        return True
    if hasattr(proc, "poll"):
        return proc.poll() is None
    try:
        os.kill(int(proc), 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def wait_health(base_url, timeout=600.0, proc=None, interval=1.0):
    """Poll base_url/health until 200.  Raises TimeoutError after `timeout`
    seconds, RuntimeError at once if `proc` (a Popen or a pid) has died."""
    deadline = time.monotonic() + timeout
    url = base_url.rstrip("/") + "/health"
    last = None
    while time.monotonic() < deadline:
        if not _pid_alive(proc):
            raise RuntimeError(f"server process for {base_url} exited before becoming healthy")
        try:
            status, _ = _request(url, timeout=5)
            if status == 200:
                return time.monotonic() - (deadline - timeout)
            last = f"HTTP {status}"
        except (urllib.error.URLError, ConnectionError, OSError) as e:
            last = repr(e)
        time.sleep(interval)
    raise TimeoutError(f"{url} not healthy after {timeout:.0f}s (last: {last})")


def chat_image(base_url, model="tiny", max_tokens=12, prompt=DEFAULT_PROMPT,
               ec_transfer_params=None, uuid=None, image_seed=0, png=None,
               timeout=600.0, extra=None):
    """One chat completion with one image + fixed text, greedy (temperature 0,
    ignore_eos so exactly max_tokens tokens come back).  Returns a dict:
      text, token_ids (list[int] or None), prompt_token_ids, ec_transfer_params,
      kv_transfer_params, finish_reason, usage, raw (the parsed response).
    Raises RuntimeError on a non-200 answer (message includes the body)."""
    png = make_png(seed=image_seed) if png is None else png
    image_part = {"type": "image_url", "image_url": {"url": png_data_url(png)}}
    if uuid is not None:
        image_part["uuid"] = uuid
    body = {
        "model": model,
        "messages": [{"role": "user", "content": [image_part, {"type": "text", "text": prompt}]}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "seed": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 1,
    }
    if ec_transfer_params is not None:
        body["ec_transfer_params"] = ec_transfer_params
    if extra:
        body.update(extra)
    status, data = _request(base_url.rstrip("/") + "/v1/chat/completions", body, timeout=timeout)
    if status != 200:
        raise RuntimeError(f"chat completion -> HTTP {status}: {data[:2000].decode(errors='replace')}")
    raw = json.loads(data)
    ch = raw["choices"][0]
    token_ids = ch.get("token_ids")  # vLLM's return_token_ids extension
    lp = ch.get("logprobs") or {}
    return {
        "text": ch["message"].get("content"),
        "token_ids": token_ids,
        "tokens": [c.get("token") for c in (lp.get("content") or [])],
        "prompt_token_ids": raw.get("prompt_token_ids"),
        "ec_transfer_params": raw.get("ec_transfer_params", ch.get("ec_transfer_params")),
        "kv_transfer_params": raw.get("kv_transfer_params"),
        "finish_reason": ch.get("finish_reason"),
        "usage": raw.get("usage"),
        "raw": raw,
    }


# ---------------------------------------------------------------- CLI
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("health")
    h.add_argument("url")
    h.add_argument("--timeout", type=float, default=600)
    h.add_argument("--pid", type=int, default=None)
    c = sub.add_parser("chat")
    c.add_argument("url")
    c.add_argument("--model", default="tiny")
    c.add_argument("--max-tokens", type=int, default=12)
    c.add_argument("--prompt", default=DEFAULT_PROMPT)
    c.add_argument("--uuid", default=None)
    c.add_argument("--ec-transfer-params", default=None, help="JSON object")
    c.add_argument("--image-seed", type=int, default=0)
    c.add_argument("--timeout", type=float, default=600)
    c.add_argument("--raw", action="store_true", help="include the raw response")
    p = sub.add_parser("png")
    p.add_argument("out")
    p.add_argument("--image-seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.cmd == "health":
        t = wait_health(a.url, a.timeout, a.pid)
        print(json.dumps({"healthy": True, "waited_s": round(t, 1)}))
    elif a.cmd == "png":
        with open(a.out, "wb") as f:
            f.write(make_png(seed=a.image_seed))
    else:
        ecp = json.loads(a.ec_transfer_params) if a.ec_transfer_params else None
        r = chat_image(a.url, a.model, a.max_tokens, a.prompt, ecp, a.uuid, a.image_seed,
                       timeout=a.timeout)
        if not a.raw:
            r.pop("raw")
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
