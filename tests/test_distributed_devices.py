"""Each process on its own GPU, whoever made the process group (torchrun through vitzoo, or the
caller's `init_process_group` / `mp.spawn`), and the ranks agreeing on host numbers without a
hang. Shown on the CPU with gloo groups and a stand-in for torch.cuda, and on GPUs with NCCL."""

import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vitzoo.errors import ConfigError
from vitzoo.train import distributed

LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def fake_gpus(patch, count: int, capability=(9, 0), arches=("sm_80", "sm_90")) -> list:
    """torch.cuda as on a machine of `count` GPUs (`patch`: monkeypatch.setattr's signature);
    returns the list of the devices made current."""
    chosen: list[torch.device] = []
    for name, value in dict(is_available=lambda: True, device_count=lambda: count,
                            set_device=lambda device: chosen.append(torch.device(device)),
                            get_device_capability=lambda device=None: capability,
                            get_arch_list=lambda: list(arches),
                            get_device_name=lambda device=None: "Some GPU",
                            get_device_properties=lambda device=None: SimpleNamespace(
                                uuid=f"GPU-{torch.device(device).index}")).items():
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


def test_a_named_gpu_under_torchrun_is_refused_naming_the_fix(monkeypatch):
    torchrun_rank(monkeypatch, 0, 0)
    fake_gpus(monkeypatch.setattr, 2)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: pytest.fail("a group was made"))
    with pytest.raises(ConfigError, match=r"one GPU; use --device cuda.*CUDA_VISIBLE_DEVICES"):
        distributed.setup("cuda:1")


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


def _agree_over_nccl(rank: int, store_path: str, results) -> None:
    import dataclasses

    for name in LAUNCH_VARIABLES:
        os.environ.pop(name, None)
    os.environ["LOCAL_WORLD_SIZE"] = "0"  # as if across nodes: no gloo group
    dist.init_process_group("nccl", store=dist.FileStore(store_path, 1), rank=0, world_size=1)
    try:
        env = distributed.setup("cuda")
        # a one-process group: the Env claims two so that the collective runs
        agreed = distributed.host_max([3.5, 1.0], dataclasses.replace(env, world_size=2))
        results[rank] = (env.host_group, str(env.host_device), agreed)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_host_numbers_agreed_over_nccl_are_the_numbers(tmp_path):
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_agree_over_nccl, args=(str(tmp_path / "store"), results), nprocs=1)
        seen = dict(results)
    assert seen == {0: (None, "cuda:0", [3.5, 1.0])}
