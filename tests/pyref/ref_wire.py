# SPDX-License-Identifier: Apache-2.0
"""ref_wire — the Python reference's wire format, rebuilt with python3-msgpack.

vLLM's ECCPUConnector encodes XferReq / XferAck with msgspec (tagged structs,
omit_defaults=True). msgspec is not packaged for Debian, so this module
produces the same bytes with msgpack: a dict whose first key is "type", then
the fields in declaration order, defaults left out. The test suite checks it
against tests/vectors/wire.json, so the Python peers that ecx is tested
against speak exactly the reference's format.
"""
import hashlib
import json

import msgpack

EC_CONNECTOR_VERSION = 1
OK, NACK_MISSING, NACK_INCOMPAT, NACK_VERSION, NACK_INTERNAL, NACK_NOT_READY = range(6)

REQ_FIELDS = (("mm_hash", None), ("compatibility_hash", None), ("session_id", ""),
              ("connector_version", EC_CONNECTOR_VERSION))
ACK_FIELDS = (("mm_hash", None), ("status", None), ("session_id", ""),
              ("src_block_indices", []), ("agent_metadata", b""), ("mem_descriptor", b""))


def _encode(tag, fields, values):
    out = {"type": tag}
    for name, default in fields:
        if name not in values:
            if default is None:
                raise ValueError("missing required field " + name)
            continue
        v = values[name]
        if default is not None and v == default:
            continue  # omit_defaults
        out[name] = v
    return msgpack.packb(out, use_bin_type=True)


def encode_req(**values):
    return _encode("req", REQ_FIELDS, values)


def encode_ack(**values):
    return _encode("ack", ACK_FIELDS, values)


def decode(frame, tag, version=EC_CONNECTOR_VERSION):
    """Decode like msgspec.msgpack.Decoder(XferReq|XferAck); raises ValueError.
    An absent connector_version is the decoder's own: version (a version-2
    reference decodes it as 2; docs/PROTOCOL.md §3.7)."""
    fields = REQ_FIELDS if tag == "req" else ACK_FIELDS
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as e:  # msgspec raises DecodeError
        raise ValueError(str(e))
    if not isinstance(obj, dict):
        raise ValueError("not a map")
    if "type" in obj and obj["type"] != tag:
        raise ValueError("wrong tag")
    out = {}
    for name, default in fields:
        if name in obj:
            out[name] = obj[name]
        elif default is None:
            raise ValueError("missing " + name)
        else:
            out[name] = version if name == "connector_version" else default
    return out


def compat_hash(vllm_version, model, dtype, block_size_bytes):
    factors = json.dumps([vllm_version, model, dtype, block_size_bytes], separators=(",", ":"))
    return hashlib.sha256(factors.encode("utf-8")).hexdigest()
