"""When one rank of a data-parallel run fails, every rank ends: work that can fail on one rank is
followed by an agreement on whether it failed anywhere."""

import datetime
import json
import multiprocessing
import socket
from pathlib import Path

import pytest
import torch

from vitzoo.train import distributed


class DamagedOnRankOne(torch.utils.data.Dataset):
    """Images whose every odd index (rank 1's share of two) cannot be read."""

    targets = torch.arange(8) % 2

    def __len__(self):
        return 8

    def __getitem__(self, index):
        if index % 2:
            raise OSError(f"image {index} is damaged")
        return torch.zeros(1, 8, 8, dtype=torch.uint8), index % 2


def _features_then_a_barrier(rank: int, port: int, out: str) -> None:
    """A rank of two: the few-shot features of a dataset that fails on rank 1 only, then, as the
    training loop does, the next collective."""
    import torch.distributed as dist

    import vitzoo
    from vitzoo.train.inputs import shared_features

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    env = distributed.Env(rank, 2, rank, torch.device("cpu"))
    model = vitzoo.create("vit_ti16", img_size=8, patch_size=4, in_chans=1, embed_dim=16, depth=1,
                          num_heads=2, mlp_dim=16)
    try:
        shared_features(model, env)(DamagedOnRankOne(), None)
        outcome = "no error"
    except Exception as exc:  # what each rank saw
        outcome = f"{type(exc).__name__}: {exc}"
    distributed.barrier(env)
    Path(out, f"rank{rank}.json").write_text(json.dumps(outcome))
    dist.destroy_process_group()


@pytest.mark.slow
def test_a_share_that_fails_on_one_rank_fails_every_rank_at_the_same_point(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    ranks = [context.Process(target=_features_then_a_barrier, args=(r, port, str(tmp_path)))
             for r in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(90)
    alive = [p.pid for p in ranks if p.is_alive()]
    for p in ranks:
        p.kill()
    assert not alive, "a rank still waits for the other"
    assert json.loads((tmp_path / "rank1.json").read_text()) == "OSError: image 1 is damaged"
    assert json.loads((tmp_path / "rank0.json").read_text()).startswith("RankFailed: rank(s) 1")


def _fail_on_rank_1(run, device, out):
    """Rank 1 fails once the group exists; rank 0 waits, as in an NCCL collective whose peer is
    gone, for ever."""
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 fails on purpose")
    dist.distributed_c10d._get_default_store().wait(["never set"], datetime.timedelta(seconds=600))


@pytest.mark.slow
def test_a_failing_rank_fails_its_run_through_the_elastic_launcher_with_its_error(tmp_path):
    from benchmarks.runner import assign, execute
    from benchmarks.suite import ResultStore, Run

    store = ResultStore(tmp_path)
    with pytest.raises(RuntimeError, match=r"(?s)rank 1 failed.*rank 1 fails on purpose.*logs of"):
        execute([Run("x", "failing", {}, 0)], _fail_on_rank_1, store,
                assign("cpu", processes_per_run=2), quiet=True)
    assert not store.keys()  # no record: the run is not done
