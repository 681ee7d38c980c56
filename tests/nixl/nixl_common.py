# SPDX-License-Identifier: Apache-2.0
"""What the NIXL test peers share: the nixl package's API module and vLLM's
control-plane structs (msgspec tagged structs, as vLLM 0.34.0 encodes them)."""
import msgspec

try:
    import nixl_cu12._api as nixl_api  # noqa: F401
except ImportError:  # the meta package picks the build for the local CUDA
    import nixl._api as nixl_api  # noqa: F401


class XferReq(msgspec.Struct, tag="req", omit_defaults=True):
    mm_hash: str
    compatibility_hash: str
    session_id: str = ""
    connector_version: int = 1


class XferAck(msgspec.Struct, tag="ack", omit_defaults=True):
    mm_hash: str
    status: int
    session_id: str = ""
    src_block_indices: list[int] = []
    agent_metadata: bytes = b""
    mem_descriptor: bytes = b""
