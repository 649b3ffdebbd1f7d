"""Starts `mtrun PLAN --nproc N ...`, waits until every rank trains, kills
the launcher with SIGNAL and counts the ranks left after a few seconds.

  kill_launcher.py SIGNAL N PLAN [mtrun args...]

A rank is a process whose command line names PLAN (a path unique to the
test) and whose parent was the launcher."""
import os
import signal
import subprocess
import sys
import time


def procs_naming(path):
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                args = f.read().split(b"\0")
            with open("/proc/%s/stat" % pid) as f:
                stat = f.read()
        except OSError:
            continue
        state = stat[stat.rindex(")") + 2]
        if path.encode() in args and state != "Z":
            found[int(pid)] = int(stat[stat.rindex(")") + 2:].split()[1])
    return found


def main():
    sig = getattr(signal, sys.argv[1])
    nproc, plan = int(sys.argv[2]), sys.argv[3]
    launcher = subprocess.Popen(["mtrun", plan, "--nproc", str(nproc)] + sys.argv[4:],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    # Every rank has trained an iteration once the printing rank logs one.
    for line in launcher.stdout:
        if b" iteration " in line and b"consumed samples" in line:
            break
    else:
        print("the run ended before it trained: exit %s" % launcher.wait())
        return 1
    ranks = [p for p, parent in procs_naming(plan).items() if parent == launcher.pid]
    print("ranks training: %d" % len(ranks))
    os.kill(launcher.pid, sig)
    launcher.wait()
    launcher.stdout.close()
    deadline = time.time() + 5
    while time.time() < deadline:
        left = [p for p in ranks if p in procs_naming(plan)]
        if not left:
            break
        time.sleep(0.05)
    print("ranks left %s after the launcher was killed: %d" % (sys.argv[1], len(left)))
    for p in left:  # do not leave them behind either way
        os.kill(p, signal.SIGKILL)
    return 0


sys.exit(main())
