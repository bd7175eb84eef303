"""Operator by operator: where vitzoo and a peer spend an inference call, side by side.

    python -m benchmarks.speed.profile vit_b16_hybrid --peer timm --dtype bf16 --batch 2 --threads 1

Both models hold the same weights (read through vitzoo's converters) and run eagerly under the same
autocast; torch.profiler records every operator's own CPU time over a few calls after two warm-up
calls. The table lists the operators that take the most time in either, with their calls per forward,
and is written to `benchmarks/results/speed/profile_<model>_<dtype>.md` with the machine it ran on.
This answers "does vitzoo do work the peer does not?"; the speed benchmark answers "how fast?".
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.machine import environment
from benchmarks.speed.cases import DTYPES, cases, converted
from vitzoo.io import write_text
from vitzoo.precision import autocast

OUT = Path(__file__).resolve().parents[1] / "results" / "speed"


def operator_ms(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype | None, calls: int) -> dict[str, tuple[float, int]]:
    """Each operator's own CPU milliseconds and calls per forward pass of `model` on `x`."""
    with torch.inference_mode(), autocast(x.device, dtype):
        model(x)
        model(x)
        with profile(activities=[ProfilerActivity.CPU]) as recorded:
            for _ in range(calls):
                model(x)
    return {e.key: (e.self_cpu_time_total / 1e3 / calls, e.count // calls) for e in recorded.key_averages()}


def table(mine: dict[str, tuple[float, int]], theirs: dict[str, tuple[float, int]], peer: str, rows: int) -> str:
    names = sorted(set(mine) | set(theirs), key=lambda k: (-max(mine.get(k, (0, 0))[0], theirs.get(k, (0, 0))[0]), k))
    lines = [f"| operator | {peer} ms | calls | vitzoo ms | calls |", "|---|---|---|---|---|"]
    for name in names[:rows]:
        (t, tn), (v, vn) = theirs.get(name, (0.0, 0)), mine.get(name, (0.0, 0))
        lines.append(f"| `{name}` | {t:.1f} | {tn} | {v:.1f} | {vn} |")
    total_t, total_v = sum(t for t, _ in theirs.values()), sum(v for v, _ in mine.values())
    lines.append(f"| **all operators** | **{total_t:.1f}** | | **{total_v:.1f}** ({total_v / total_t:.2f}x) | |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    from vitzoo.argvalues import ArgumentParser

    parser = ArgumentParser(prog="python -m benchmarks.speed.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a speed-benchmark case: vit_b16 or vit_b16_hybrid")
    parser.add_argument("--peer", default="timm", help="timm or torchvision (where the case has it)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="the precision to profile in")
    parser.add_argument("--batch", type=int, default=2, help="images per call")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--calls", type=int, default=3, help="profiled calls, after a warm-up")
    parser.add_argument("--rows", type=int, default=20, help="rows of the profile table to print")
    return parser


def main(argv: list[str] | None = None) -> Path:
    parser = build_parser()
    args = parser.parse_args(argv)
    by_name = {case.vitzoo_name: case for case in cases(quick=False)["inference"]}
    if args.model not in by_name:
        parser.error(f"no speed-benchmark case {args.model!r}: use one of {', '.join(by_name)}")
    case = by_name[args.model]
    if args.peer not in case.peers:
        parser.error(f"{args.model} has no {args.peer} peer: use one of {', '.join(case.peers)}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    peer = case.peers[args.peer]().eval()
    model = converted(peer, case).eval()
    x = torch.randn(args.batch, 3, case.img_size, case.img_size)
    dtype = DTYPES[args.dtype]
    mine, theirs = operator_ms(model, x, dtype, args.calls), operator_ms(peer, x, dtype, args.calls)
    env = environment("cpu")
    text = (f"# Operator profile: {args.model}, vitzoo against {args.peer}, {args.dtype} (eager)\n\n"
            f"`python -m benchmarks.speed.profile {args.model} --peer {args.peer} --dtype {args.dtype} --batch {args.batch} "
            f"--threads {args.threads} --calls {args.calls}`: each operator's own CPU time per forward pass of batch "
            f"{args.batch} at {case.img_size} px, {args.threads} thread(s), mean of {args.calls} profiled calls after two "
            f"warm-up calls. {env['cpu']} ({', '.join(env['cpu_flags']) or 'no listed flags'}), torch {env['torch']}, "
            f"commit {env['commit']}, {env['date']}. Profiler times are for comparing the two columns, not for speed.\n\n"
            + table(mine, theirs, args.peer, args.rows) + "\n")
    path = OUT / f"profile_{args.model}_{args.dtype}.md"
    write_text(path, text)
    print(text)
    return path


if __name__ == "__main__":
    main()
