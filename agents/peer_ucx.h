/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peer_ucx — run ecx-nixl-agent on the UCX its NIXL peers run
 * (ECX_NIXL_UCX; docs/NIXL.md §5).
 *
 * The agent is linked against the UCX ecx was built with (Debian's 1.13);
 * vLLM's NIXL runs the UCX its nixl wheel bundles (1.23), and the two agree
 * on tcp only. With ECX_NIXL_UCX=DIR, a directory holding the peer's UCX
 * libraries (libucp, libucs, libuct, libucm, and its modules in DIR/ucx;
 * plain names or as auditwheel renames them, e.g. site-packages/
 * nixl_cu12.libs), the agent re-executes itself on that UCX:
 *
 *   1. In a private directory (mkdtemp under $TMPDIR, else /tmp) it links
 *      the name of every UCX library this program loaded (libucp, libucs,
 *      and libuct, libucm where it links them itself) to DIR's file of
 *      that library, and each of DIR's modules to the name UCX will look
 *      for (UCX takes the modules' suffix from its libucs's file name).
 *   2. It execs itself with that directory, then DIR, first in
 *      LD_LIBRARY_PATH (DIR for the libraries DIR's own load by their own
 *      names), ECX_NIXL_UCX_LINKS naming the directory, and UCX_LOG_LEVEL
 *      at "error" unless the operator set it (the level must not be poked
 *      into a libucs of another version).
 *   3. Run again, it checks that every UCX library it loaded came from
 *      DIR. (DIR's libucp was loaded once in a child before step 1: one
 *      that does not load would fail in the dynamic loader, before this
 *      program could say why or remove its links.)
 * The directory is removed once the agent's UCX is up (ecxi_peer_ucx_done)
 * or when any step fails. Every failure is a line on stderr and exit
 * status 2: the library says the agent did not start (a context then fails
 * to start; a restarted agent's READs fail, and their items fall back).
 */
#ifndef ECXI_PEER_UCX_H
#define ECXI_PEER_UCX_H

#include <stdbool.h>

/* Call first in main. Returns false without ECX_NIXL_UCX (the built-in
 * UCX); true when this process runs on DIR's UCX. Does not return when it
 * re-executes; exits 2 on any failure. */
bool ecxi_peer_ucx_enter(char **argv);
/* Remove the link directory (UCX and its modules are loaded by now). */
void ecxi_peer_ucx_done(void);

#endif
