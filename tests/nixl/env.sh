# SPDX-License-Identifier: Apache-2.0
# env.sh — source it before running NIXL (Python or ecx's nixl path) on a CPU-only host.
# Every setting keeps a value the caller already exported.
#
# UCX_MODULES  nixl-cu12's bundled UCX loads its InfiniBand modules (libuct_ib*), which pull
#              in a bundled libnl-route whose destructor segfaults at process exit
#              (rtnl_tc_unregister from _dl_fini: every process that made a NIXL agent
#              exits 139). No IB and no CUDA here: skip those modules (glob list, ^ = not).
# UCX_TLS      left to UCX: on one host it picks shared memory + cma, else tcp. Set
#              UCX_TLS=tcp,self to force the TCP path (what two hosts without RDMA use).
# UCX_RCACHE_MAX_UNRELEASED  what vllm/distributed/nixl_utils.py sets when nixl is imported
#              after it; set here so it holds for every process whatever the import order.
# NIXL_LOG_LEVEL quiet NIXL's per-agent INFO lines.
export UCX_MODULES=${UCX_MODULES:-^ib*,rdmacm,cuda*}
export UCX_RCACHE_MAX_UNRELEASED=${UCX_RCACHE_MAX_UNRELEASED:-1024}
export NIXL_LOG_LEVEL=${NIXL_LOG_LEVEL:-WARN}

# nixl_ucx_dir PYTHON: the directory of the UCX that PYTHON's nixl wheel bundles, the one
# vLLM's NIXL runs: what ECX_NIXL_UCX names to run ecx's NIXL agent on it (docs/NIXL.md §5).
nixl_ucx_dir() { "$1" -c 'import nixl_cu12, os; print(os.path.dirname(nixl_cu12.__file__) + ".libs")'; }
