/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli — what the ecx subcommands share: exit codes and the entry points
 * that tools/ecx.c dispatches to.
 *
 * Exit codes: 0 success, 1 the input or the operation failed, 2 usage error.
 */
#ifndef ECX_CLI_H
#define ECX_CLI_H

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

int cmd_proto(int argc, char **argv);
int cmd_compat_hash(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_get(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_events(int argc, char **argv);
int cmd_ping(int argc, char **argv);
int cmd_bench(int argc, char **argv);
/* `ecx bench data` (tools/cmd_bench_data.c); its help is help then help_tail
 * (tools/cmd_bench.c). */
int cmd_bench_data(int argc, char **argv, const char *help, const char *help_tail);
/* `ecx bench stall` (tools/cmd_bench_stall.c), with its own --help. */
int cmd_bench_stall(int argc, char **argv);

/* Print "ecx: <msg>" to stderr and return EXIT_USAGE (tools/opts.c). */
int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
