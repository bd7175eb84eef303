"""Each process on its own GPU, whoever made the process group (torchrun through vitzoo, or the
caller's `init_process_group` / `mp.spawn`), and the ranks agreeing on host numbers without a
device sync. Shown on the CPU with gloo groups and a stand-in for torch.cuda, and on GPUs with
NCCL."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vitzoo.train import distributed

LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def fake_gpus(patch, count: int) -> list:
    """torch.cuda as on a machine of `count` GPUs (`patch`: monkeypatch.setattr's signature);
    returns the list of the devices made current."""
    chosen: list[torch.device] = []
    for name, value in dict(is_available=lambda: True, device_count=lambda: count,
                            set_device=lambda device: chosen.append(torch.device(device))).items():
        patch(torch.cuda, name, value)
    return chosen


def _setup_in_callers_group(rank: int, world: int, store_path: str, results) -> None:
    """A process of `mp.spawn` that makes its own gloo group, then sets up vitzoo on `cuda`."""
    for name in LAUNCH_VARIABLES:
        os.environ.pop(name, None)
    chosen = fake_gpus(setattr, world)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world)
    try:
        env = distributed.setup("cuda")
        results[rank] = (env.rank, env.world_size, str(env.device), [str(d) for d in chosen])
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_group_the_caller_made_puts_each_rank_on_its_own_gpu(tmp_path):
    """Not every rank on GPU 0, which NCCL refuses at the first collective."""
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_setup_in_callers_group, args=(2, str(tmp_path / "store"), results), nprocs=2)
        seen = dict(results)
    assert seen == {0: (0, 2, "cuda:0", ["cuda:0"]), 1: (1, 2, "cuda:1", ["cuda:1"])}


def test_one_process_on_a_named_gpu_makes_it_its_current_device(monkeypatch):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    chosen = fake_gpus(monkeypatch.setattr, 2)
    env = distributed.setup("cuda:1")
    assert env.device == torch.device("cuda", 1) == chosen[0] and not env.distributed


def torchrun_rank(monkeypatch, rank: int, local_rank: int) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))


def test_under_torchrun_the_local_ranks_gpu_is_made_current_before_the_nccl_group(monkeypatch):
    torchrun_rank(monkeypatch, 3, 1)
    chosen, made = fake_gpus(monkeypatch.setattr, 2), []

    def init_process_group(backend, **kwargs):
        made.append((backend, list(chosen)))
        raise InterruptedError

    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    with pytest.raises(InterruptedError):
        distributed.setup("cuda")
    assert made == [("nccl", [torch.device("cuda", 1)])]


@pytest.mark.parametrize(("environ", "over_gloo"), [
    ({"LOCAL_WORLD_SIZE": "16"}, True),  # one node: gloo reaches every rank
    ({"LOCAL_WORLD_SIZE": "8"}, False),  # two nodes: gloo could bind the loopback and hang
    ({"LOCAL_WORLD_SIZE": "8", "GLOO_SOCKET_IFNAME": "eth0"}, True),
    ({}, False)])
def test_host_numbers_go_over_gloo_where_it_reaches_every_rank_else_over_nccl(
        monkeypatch, environ, over_gloo):
    """Decided alike on every rank (a rank of another node may see otherwise), once a process."""
    made = []
    monkeypatch.setattr(distributed, "_HOST_GROUP", {})
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 16)
    monkeypatch.setattr(dist, "new_group", lambda **kwargs: made.append(kwargs) or "gloo group")
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, op=None: None)
    for name in ("LOCAL_WORLD_SIZE", "GLOO_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    gpu = torch.device("cpu")  # stands in for the rank's GPU
    expected = ("gloo group", torch.device("cpu")) if over_gloo else (None, gpu)
    assert distributed.host_agreement(gpu) == distributed.host_agreement(gpu) == expected
    assert len(made) == over_gloo


def _nccl_in_callers_group(rank: int, world: int, store_path: str, results) -> None:
    for name in LAUNCH_VARIABLES:
        os.environ.pop(name, None)
    dist.init_process_group("nccl", store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world)
    try:
        env = distributed.setup("cuda")
        distributed.barrier(env)
        objects = distributed.gather_objects(str(env.device), env)
        total = distributed.all_reduce(torch.ones(1, device=env.device), env)
        agreed = distributed.host_max([float(rank), 1.0], env)
        results[rank] = (str(env.device), torch.cuda.current_device(), objects, total.item(),
                         agreed)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_nccl_collectives_in_a_group_the_caller_made_run_on_distinct_gpus(tmp_path):
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_nccl_in_callers_group, args=(2, str(tmp_path / "store"), results), nprocs=2)
        seen = dict(results)
    for rank in (0, 1):
        assert seen[rank] == (f"cuda:{rank}", rank, ["cuda:0", "cuda:1"], 2.0, [1.0, 1.0])
