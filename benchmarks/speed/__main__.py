"""`python -m benchmarks.speed [--only inference|training|fastest] [--quick] [--device ...]`: one kind of case;
`--probe CASE CONTESTANT BATCH DTYPE` is the memory probe's child process (benchmarks/speed/memory.py)."""

import sys

import torch

from benchmarks.speed.measure import main
from benchmarks.speed.memory import probe

if __name__ == "__main__":
    argv = sys.argv[1:]
    if {"-h", "--help"} & set(argv):  # the usage, not a run of the whole benchmark
        print(__doc__)
        sys.exit(0)
    device_arg = argv[argv.index("--device") + 1] if "--device" in argv else "cpu"
    if argv[:1] == ["--probe"]:
        probe(int(argv[1]), argv[2], int(argv[3]), argv[4], "--quick" in argv, torch.device(device_arg))
    else:
        only = argv[argv.index("--only") + 1].split(",") if "--only" in argv else ["inference", "training", "fastest"]
        main(quick="--quick" in argv, device=device_arg, kinds=tuple(only))
