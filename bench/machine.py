"""What the benchmarks record about the machine they ran on."""
import os
import subprocess
import threading


def cpu_name():
    """The CPU's model name from /proc/cpuinfo, or "unknown CPU"."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def nvidia_smi(*query):
    """nvidia-smi's CSV answer (no header, no units) as lines, or None when
    nvidia-smi is missing or fails (no GPU, no driver)."""
    try:
        r = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    return [line.strip() for line in r.stdout.splitlines() if line.strip()]


def gpu_name_and_driver():
    """(name, driver version) of GPU 0 from nvidia-smi, or None without one."""
    lines = nvidia_smi("--query-gpu=name,driver_version")
    if not lines:
        return None
    name, _, driver = lines[0].rpartition(",")
    return name.strip(), driver.strip()


class GpuMemoryPoller:
    """Polls nvidia-smi in a thread while a process runs and keeps the peak
    of the GPU memory it uses, in bytes.

    Preferred: the process's own used memory from --query-compute-apps (its
    PID or a child's). Inside a container nvidia-smi often lists no
    processes; then the fallback is GPU 0's memory.used minus what was used
    before the process started. `source` says which one the peak comes from.
    Allocations that live shorter than the poll interval can be missed; mt
    allocates its memory once at start, so its peak lasts the whole run.
    """

    def __init__(self, interval_s=0.2):
        self.interval_s = interval_s
        self.peak = 0
        self.source = None
        self._pids = set()
        self._stop = threading.Event()
        self._thread = None
        base = nvidia_smi("--query-gpu=memory.used")
        self._baseline = int(base[0]) * 2**20 if base else None

    def start(self, pid):
        self._pids = {pid}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        if self._thread:
            self._thread.join()
        return self.peak

    def _children(self):
        # Ranks or compile workers a process starts also count as its memory.
        pids = set(self._pids)
        try:
            for pid in list(pids):
                path = f"/proc/{pid}/task/{pid}/children"
                if os.path.exists(path):
                    pids.update(int(p) for p in open(path).read().split())
        except (OSError, ValueError):
            pass
        self._pids = pids
        return pids

    def _run(self):
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)
        self._sample()

    def _sample(self):
        apps = nvidia_smi("--query-compute-apps=pid,used_memory")
        if apps is not None:
            pids = self._children()
            used = sum(int(mem) * 2**20 for pid, mem in (a.split(",") for a in apps)
                       if int(pid) in pids)
            if used:
                self.source = "nvidia-smi, the process's used memory"
                self.peak = max(self.peak, used)
                return
        if self.source is None or self.source.startswith("nvidia-smi, GPU"):
            total = nvidia_smi("--query-gpu=memory.used")
            if total and self._baseline is not None:
                self.source = "nvidia-smi, GPU memory used minus before the run"
                self.peak = max(self.peak, int(total[0]) * 2**20 - self._baseline)
