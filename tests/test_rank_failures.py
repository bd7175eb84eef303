"""When one rank of a data-parallel run fails, every rank ends: work that can fail on one rank alone is
followed by an agreement on whether it failed anywhere, collectives time out instead of waiting for ever,
and a GPU is never shared by two ranks without a word."""

import datetime
import json
import multiprocessing
import os
import socket
from pathlib import Path

import pytest
import torch

from vitzoo.errors import ConfigError
from vitzoo.train import distributed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DamagedOnRankOne(torch.utils.data.Dataset):
    """Images whose every odd index (rank 1's share of two) cannot be read."""

    targets = torch.arange(8) % 2

    def __len__(self):
        return 8

    def __getitem__(self, index):
        if index % 2:
            raise OSError(f"image {index} is damaged")
        return torch.zeros(1, 8, 8, dtype=torch.uint8), index % 2


def _extract_then_agree(rank: int, port: int, out: str) -> None:
    """A rank of two: the few-shot features of a dataset that fails on rank 1 only; then, as the training
    loop does after a failure, it goes on to the next collective (a barrier)."""
    import torch.distributed as dist

    import vitzoo
    from vitzoo.train.build import Evaluation

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    env = distributed.Env(rank, 2, rank, torch.device("cpu"))
    model = vitzoo.create("vit_ti16", img_size=8, patch_size=4, in_chans=1, embed_dim=16, depth=1, num_heads=2, mlp_dim=16)
    evaluation = Evaluation(model, env, batch_size=4, num_workers=0, pin_memory=False, autocast_dtype=None)
    try:
        evaluation.features(DamagedOnRankOne(), None)
        outcome = "no error"
    except Exception as exc:  # what each rank saw
        outcome = f"{type(exc).__name__}: {exc}"
    distributed.barrier(env)
    Path(out, f"rank{rank}.json").write_text(json.dumps(outcome))
    dist.destroy_process_group()


@pytest.mark.slow
def test_a_share_that_fails_on_one_rank_fails_every_rank_at_the_same_point(tmp_path):
    context = multiprocessing.get_context("spawn")
    port = free_port()
    ranks = [context.Process(target=_extract_then_agree, args=(r, port, str(tmp_path))) for r in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(90)
    alive = [p.pid for p in ranks if p.is_alive()]
    for p in ranks:
        p.kill()
    assert not alive, "a rank still waits for the other"
    assert json.loads((tmp_path / "rank1.json").read_text()) == "OSError: image 1 is damaged"
    assert json.loads((tmp_path / "rank0.json").read_text()).startswith("RankFailed: rank(s) 1 failed")


def test_a_task_bound_to_one_gpu_works_on_it_whatever_its_local_rank():
    """SLURM's --gpu-bind / --gpus-per-task show each task its own GPU as device 0."""
    assert distributed.own_gpu(local_rank=5, gpus=1) == 0
    assert distributed.own_gpu(local_rank=5, gpus=8) == 5
    with pytest.raises(RuntimeError, match="more processes than its 4 visible"):
        distributed.own_gpu(local_rank=5, gpus=4)


def test_two_ranks_on_one_gpu_are_refused_on_every_rank_naming_them():
    distributed.refuse_shared_gpus([("node1", "GPU-a"), ("node1", "GPU-b"), ("node2", "GPU-a")])  # distinct: fine
    with pytest.raises(ConfigError, match=r"ranks 0, 2 all work on GPU GPU-a of node1.*--gpus-per-task"):
        distributed.refuse_shared_gpus([("node1", "GPU-a"), ("node1", "GPU-b"), ("node1", "GPU-a")])
