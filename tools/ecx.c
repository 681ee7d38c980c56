/* SPDX-License-Identifier: Apache-2.0 */
/* ecx — the command line: dispatches to one subcommand per file. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "ecx.h"
#include "keys.h"

static const char HELP[] =
    "usage: ecx COMMAND [ARGS]\n"
    "\n"
    "ecx moves vision-encoder outputs between LLM serving instances (vLLM's\n"
    "ECCPUConnector protocol, versions 1 and 2: 2 is vLLM >= 0.32's).\n"
    "\n"
    "commands:\n"
    "  serve          run a producer: serve files or synthetic encodings\n"
    "  get            run a consumer: fetch items into files\n"
    "  events HOST:PORT  print a producer's encoder-cache events (docs/EVENTS.md)\n"
    "  ping HOST:PORT is a producer there, and would it serve these settings? (< 2 s;\n"
    "                 the exit status says what is wrong)\n"
    "  demo           the main job: a producer and consumers on loopback, checked\n"
    "  bench ctrl     control-plane load against a producer (requests/s, p50, p99)\n"
    "  bench data     fetch-to-ready throughput through the API: shm, tcp and UCX\n"
    "                 fetches against memcpy\n"
    "  bench stall    what fetching costs an engine's step: longest ecx_poll while\n"
    "                 stepping every S ms, time to ready, cold vs warm fetches\n"
    "  keygen PREFIX  write a CURVE keypair (PREFIX.key, PREFIX.pub) for an\n"
    "                 encrypted, authenticated control plane\n"
    "  compat-hash VLLM_VERSION MODEL DTYPE BLOCK_SIZE_BYTES\n"
    "                 print the peer-compatibility hash (64 hex characters)\n"
    "  proto decode [--as req|ack] [HEX]\n"
    "                 decode one XferReq / XferAck frame and print it as JSON\n"
    "  proto encode   read that JSON on stdin and print the frame as hex\n"
    "\n"
    "Run 'ecx COMMAND --help' for a command's options; 'ecx --version' for the version.\n"
    "Environment: ECX_LOG=error|warn|info|debug sets the library's log level (default\n"
    "warn); ECX_SHM_DIR the directory of region files (default /dev/shm);\n"
    "ECX_PREFAULT=0 takes a region's memory as its blocks are first used, not in\n"
    "the background; ECX_NIXL_UCX=DIR runs the nixl path's agent on the UCX\n"
    "libraries in DIR (vLLM's: the nixl wheel's, docs/NIXL.md section 5).\n"
    "Exit status: 0 success, 1 failure, 2 usage error.\n";

/* The commands, each a file of its own (cli.h): the one list of them. */
static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} COMMANDS[] = {
    {"serve", cmd_serve},   {"get", cmd_get},     {"events", cmd_events},
    {"ping", cmd_ping},     {"demo", cmd_demo},   {"bench", cmd_bench},
    {"keygen", cmd_keygen}, {"proto", cmd_proto}, {"compat-hash", cmd_compat_hash},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(HELP, stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        fputs(HELP, stdout);
        return EXIT_OK;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V")) {
        printf("ecx %s (library %s; protocol versions 1..%d, default the one --vllm-version "
               "speaks; default vLLM %s)\n", ECX_VERSION_STRING, ecx_version(),
               ECX_CONNECTOR_VERSION_MAX, ECX_DEFAULT_VLLM_VERSION);
        return EXIT_OK;
    }
    for (size_t i = 0; i < sizeof COMMANDS / sizeof *COMMANDS; i++)
        if (!strcmp(cmd, COMMANDS[i].name)) return COMMANDS[i].run(argc - 1, argv + 1);
    return usage_error("unknown command '%s' (try 'ecx --help')", cmd);
}
