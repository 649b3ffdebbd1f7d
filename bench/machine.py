"""What the benchmarks record about the machine they ran on."""


def cpu_name():
    """The CPU's model name from /proc/cpuinfo, or "unknown CPU"."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"
