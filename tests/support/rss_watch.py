# SPDX-License-Identifier: Apache-2.0
"""rss_watch — the peak RSS (MiB) of a process and of its children named
NAME, sampled every 50 ms until it exits or SECONDS pass (for
tests/shell/test_ucx_hostile.sh: `ecx get` and its UCX process, ecx-ucx-agent).

usage: rss_watch.py PID NAME SECONDS
Prints "parent PEAK_MIB children PEAK_MIB seen N" (N: children seen).
"""
import os
import sys
import time


def rss_mib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def children(pid, name):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
        except OSError:
            continue
        comm = st[st.index("(") + 1:st.rindex(")")]
        ppid = int(st[st.rindex(")") + 2:].split()[1])
        if ppid == pid and comm == name[:15]:
            out.append(int(d))
    return out


pid, name, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
peak = cpeak = 0.0
seen = set()
end = time.monotonic() + seconds
while time.monotonic() < end and os.path.exists("/proc/%d" % pid):
    peak = max(peak, rss_mib(pid))
    for c in children(pid, name):
        seen.add(c)
        cpeak = max(cpeak, rss_mib(c))
    time.sleep(0.05)
print("parent %.0f children %.0f seen %d" % (peak, cpeak, len(seen)))
