# SPDX-License-Identifier: Apache-2.0
"""ref_peer — a small Python peer speaking the reference's wire format, to
test ecx against (run with /usr/bin/python3; needs python3-zmq and
python3-msgpack).

  ref_peer.py producer PORTFILE [SECONDS]
      Bind a ROUTER on 127.0.0.1 (any port, written to PORTFILE) and answer
      each XferReq by the mm_hash's prefix, as a scripted producer:
        nack-missing*, nack-incompat*, nack-version*, nack-internal*  that NACK
        notready-then-missing*   NACK_NOT_READY the first time, then NACK_MISSING
        silent*                  no ack at all
        garbage*                 a frame that is not msgpack
        wrongtag*                an XferReq where an XferAck belongs
        badmeta*                 OK with the right count but unusable metadata
        badcount*                OK with one block fewer than asked for
      Logs one JSON line per request on stdout ({"mm_hash", "session_id",
      "answer"}), and exits after SECONDS (default 30).

  ref_peer.py consumer PORT COMPAT_HASH SCRIPT
      Play a consumer against a producer: for each line of SCRIPT (JSON:
      {"mm_hash", "compatibility_hash"?, "session_id"?, "connector_version"?,
      "raw_hex"?, "expect_reply"?}) send one frame and print the decoded reply
      (or {"reply": null} after 1 s of silence) as a JSON line. With
      REF_PEER_HOLD=1 in the environment it then sleeps until killed.
"""
import json
import os
import sys

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_wire as w  # noqa: E402


def producer(portfile, seconds):
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    tmp = portfile + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.rename(tmp, portfile)
    seen = {}
    poller = zmq.Poller()
    poller.register(s, zmq.POLLIN)
    import time
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not poller.poll(100):
            continue
        frames = s.recv_multipart()
        if len(frames) != 3 or frames[1] != b"":
            continue
        ident, _, payload = frames
        try:
            req = w.decode(payload, "req")
        except ValueError:
            continue
        h = req["mm_hash"]
        seen[h] = seen.get(h, 0) + 1
        reply, answer = None, None
        for prefix, status in (("nack-missing", w.NACK_MISSING), ("nack-incompat", w.NACK_INCOMPAT),
                               ("nack-version", w.NACK_VERSION), ("nack-internal", w.NACK_INTERNAL)):
            if h.startswith(prefix):
                reply, answer = w.encode_ack(mm_hash=h, status=status), prefix
        if h.startswith("notready-then-missing"):
            status = w.NACK_NOT_READY if seen[h] == 1 else w.NACK_MISSING
            reply, answer = w.encode_ack(mm_hash=h, status=status), "status %d" % status
        elif h.startswith("silent"):
            answer = "none"
        elif h.startswith("garbage"):
            reply, answer = b"\xc1\xff\x00garbage", "garbage"
        elif h.startswith("wrongtag"):
            reply, answer = w.encode_req(mm_hash=h, compatibility_hash="x"), "wrongtag"
        elif h.startswith("badmeta") or h.startswith("badcount"):
            n = int(h.rsplit("-", 1)[1]) if "-" in h else 1
            if h.startswith("badcount"):
                n -= 1
            reply = w.encode_ack(mm_hash=h, status=w.OK, session_id=req["session_id"],
                                 src_block_indices=list(range(n)),
                                 agent_metadata=b"NIXL" + b"\x00" * 60,
                                 mem_descriptor=b"\x01" * (14 * n))
            answer = "ok %d blocks, unusable metadata" % n
        if reply is not None:
            s.send_multipart([ident, b"", reply])
        print(json.dumps({"mm_hash": h, "session_id": req["session_id"], "answer": answer}),
              flush=True)


def consumer(port, compat, script):
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect("tcp://127.0.0.1:%d" % port)
    for line in open(script):
        if not line.strip():
            continue
        step = json.loads(line)
        if "raw_hex" in step:
            frame = bytes.fromhex(step["raw_hex"])
        else:
            fields = {"mm_hash": step["mm_hash"],
                      "compatibility_hash": step.get("compatibility_hash", compat)}
            for k in ("session_id", "connector_version"):
                if k in step:
                    fields[k] = step[k]
            frame = w.encode_req(**fields)
        s.send_multipart([b"", frame])
        out = {"sent": step.get("name", step.get("mm_hash")), "reply": None}
        if s.poll(1000 if step.get("expect_reply", True) else 300):
            empty, payload = s.recv_multipart()
            ack = w.decode(payload, "ack")
            ack["agent_metadata"] = len(ack["agent_metadata"])
            ack["mem_descriptor"] = len(ack["mem_descriptor"])
            out["reply"] = ack
            out["raw_hex"] = payload.hex()
        print(json.dumps(out), flush=True)
    if os.environ.get("REF_PEER_HOLD"):  # stay alive (holding grants) until killed
        import time
        time.sleep(3600)


if __name__ == "__main__":
    if sys.argv[1] == "producer":
        producer(sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 30)
    elif sys.argv[1] == "consumer":
        consumer(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        sys.exit("usage: ref_peer.py producer PORTFILE [SECONDS] | consumer PORT COMPAT SCRIPT")
