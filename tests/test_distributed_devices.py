"""Each process on its own GPU, whoever made the process group (torchrun through vitzoo, or the caller's
own `init_process_group` / `mp.spawn`). Shown on the CPU with gloo groups and a stand-in for torch.cuda,
and on GPUs (skipped without enough of them) with NCCL."""

import os
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vitzoo.errors import ConfigError
from vitzoo.train import distributed

TWO_GPUS = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def fake_gpus(patch, count: int) -> list[torch.device]:
    """torch.cuda as on a machine with `count` sm_90 GPUs (`patch(obj, name, value)` as monkeypatch.setattr);
    returns the list that records each set_device."""
    chosen: list[torch.device] = []
    patch(torch.cuda, "is_available", lambda: True)
    patch(torch.cuda, "device_count", lambda: count)
    patch(torch.cuda, "set_device", lambda device: chosen.append(torch.device(device)))
    patch(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    patch(torch.cuda, "get_arch_list", lambda: ["sm_80", "sm_90"])
    patch(torch.cuda, "get_device_name", lambda device=None: "Some GPU")
    patch(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(uuid=f"GPU-{torch.device(device).index}"))
    return chosen


def _setup_in_callers_group(rank: int, world: int, store_path: str, results) -> None:
    """A process of `mp.spawn` that makes its own gloo group (no torchrun variables), then sets up vitzoo on `cuda`."""
    for name in LAUNCH_VARIABLES:
        os.environ.pop(name, None)
    chosen = fake_gpus(setattr, world)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        env = distributed.setup("cuda")
        results[rank] = (env.rank, env.world_size, str(env.device), [str(d) for d in chosen])
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_group_the_caller_made_puts_each_rank_on_its_own_gpu(tmp_path):
    """Under `mp.spawn` with the caller's own init_process_group (no LOCAL_RANK), rank r works on GPU r
    and makes it its current device: not every rank on GPU 0, which NCCL refuses at the first collective."""
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_setup_in_callers_group, args=(2, str(tmp_path / "store"), results), nprocs=2, join=True)
        seen = dict(results)
    assert seen == {0: (0, 2, "cuda:0", ["cuda:0"]), 1: (1, 2, "cuda:1", ["cuda:1"])}


def test_the_gpu_of_a_rank_in_a_callers_group_is_its_rank_on_the_node(monkeypatch):
    """LOCAL_RANK decides where set; else the rank modulo LOCAL_WORLD_SIZE; else the rank (one node)."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert distributed.node_rank(5, joined=True) == 5
    assert distributed.node_rank(5, joined=False) == 0
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert distributed.node_rank(5, joined=True) == 1
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert distributed.node_rank(5, joined=True) == 3


def test_one_process_on_a_named_gpu_makes_it_its_current_device(monkeypatch):
    """Alone (no torchrun), `cuda:1` is GPU 1, and it becomes the current device."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    chosen = fake_gpus(monkeypatch.setattr, 2)
    env = distributed.setup("cuda:1")
    assert env.device == torch.device("cuda", 1) and chosen == [torch.device("cuda", 1)] and not env.distributed


def test_the_group_vitzoo_makes_under_torchrun_is_nccl_on_the_local_ranks_gpu(monkeypatch):
    """Under torchrun, the process's GPU is made current before the NCCL group is made."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    chosen = fake_gpus(monkeypatch.setattr, 2)
    made = []

    class Made(Exception):
        pass

    def init_process_group(backend, **kwargs):
        made.append((backend, list(chosen)))
        raise Made

    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    with pytest.raises(Made):
        distributed.setup("cuda")
    assert made == [("nccl", [torch.device("cuda", 1)])]


@pytest.mark.parametrize("device", ["cuda:0", "cuda:1"])
def test_a_named_gpu_under_torchrun_is_refused_naming_the_fix(monkeypatch, device):
    """`--device cuda:N` in every process torchrun starts would put them all on GPU N: an error at
    once, before any group is made, that says to use `--device cuda` and CUDA_VISIBLE_DEVICES."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    fake_gpus(monkeypatch.setattr, 2)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: pytest.fail("a group was made"))
    with pytest.raises(ConfigError, match=r"every process on GPU \d.*use --device cuda.*CUDA_VISIBLE_DEVICES"):
        distributed.setup(device)


# ---------------------------------------------------------------------------- agreeing on host numbers across nodes
TWO_NODES = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}


def resolver(*addresses):
    return lambda hostname: list(addresses)


@pytest.mark.parametrize(("environ", "addresses", "hangs"), [
    (TWO_NODES, ["127.0.1.1"], True),  # Debian's and Ubuntu's /etc/hosts
    (TWO_NODES, ["::1"], True),
    (TWO_NODES, ["10.1.2.3"], False),
    (TWO_NODES, ["10.1.2.3", "127.0.1.1"], False),  # gloo binds the first
    ({"WORLD_SIZE": "16"}, ["127.0.1.1"], True),  # LOCAL_WORLD_SIZE unknown: maybe several nodes
    ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}, ["127.0.1.1"], False),  # one node: the loopback reaches all
    ({**TWO_NODES, "GLOO_SOCKET_IFNAME": "eth0"}, ["127.0.1.1"], False),
    ({**TWO_NODES, "TP_SOCKET_IFNAME": "eth0"}, ["127.0.1.1"], False),
    (TWO_NODES, [], True),  # resolves to nothing: gloo falls back to the loopback
])
def test_gloo_would_bind_the_loopback_only_across_nodes_on_a_loopback_host_name(environ, addresses, hangs):
    """The case that hangs: several nodes, the host name resolving to a loopback address, and no
    interface named for gloo."""
    problem = distributed.gloo_loopback_problem(int(environ["WORLD_SIZE"]), environ, "node1", resolver(*addresses))
    assert (problem is not None) == hangs
    if hangs:
        assert "node1" in problem and "loopback" in problem


def test_a_host_name_that_does_not_resolve_is_the_loopback_case():
    def unresolvable(hostname):
        raise OSError("Name or service not known")

    assert "does not resolve" in distributed.gloo_loopback_problem(16, TWO_NODES, "node1", unresolvable)


def test_one_process_needs_no_agreement_across_nodes():
    assert distributed.gloo_loopback_problem(1, {}, "node1", resolver("127.0.1.1")) is None


class FakeNcclGroup:
    """torch.distributed as in a process of a 16-rank NCCL job; `elsewhere`: whether another rank
    (on another node) found the loopback problem, as the MAX all-reduce tells."""

    def __init__(self, monkeypatch, elsewhere: bool = False) -> None:
        self.new_groups: list = []
        monkeypatch.setattr(distributed, "_HOST_AGREEMENT", {})
        monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 16)
        monkeypatch.setattr(dist, "new_group", lambda **kwargs: self.new_groups.append(kwargs) or "gloo group")
        monkeypatch.setattr(dist, "all_reduce", lambda tensor, op=None, group=None: tensor.fill_(max(tensor.item(), elsewhere)))
        for name in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("WORLD_SIZE", "16")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")


def test_on_a_loopback_host_name_the_ranks_agree_over_nccl_and_say_how_to_restore_gloo(monkeypatch):
    """No gloo group is made (it would hang); host numbers go over the default group, on the device;
    a warning names GLOO_SOCKET_IFNAME. Decided once per process."""
    fake = FakeNcclGroup(monkeypatch)
    monkeypatch.setattr(distributed, "host_addresses", resolver("127.0.1.1"))
    gpu = torch.device("cpu")  # stands in for the rank's GPU
    with pytest.warns(UserWarning, match=r"loopback address 127\.0\.1\.1.*NCCL.*GLOO_SOCKET_IFNAME"):
        assert distributed.host_agreement(gpu) == (None, gpu)
    assert distributed.host_agreement(gpu) == (None, gpu)
    assert fake.new_groups == []


def test_with_a_routable_host_name_the_ranks_agree_over_a_gloo_group_on_the_host(monkeypatch, recwarn):
    fake = FakeNcclGroup(monkeypatch)
    monkeypatch.setattr(distributed, "host_addresses", resolver("10.1.2.3"))
    assert distributed.host_agreement(torch.device("cpu")) == ("gloo group", torch.device("cpu"))
    assert fake.new_groups == [{"backend": "gloo", "timeout": distributed.COLLECTIVE_TIMEOUT}] and len(recwarn) == 0


def test_a_rank_whose_own_host_is_fine_follows_the_ranks_that_are_not(monkeypatch, recwarn):
    """Every rank decides alike (making the gloo group is a collective of all): a rank on a good host
    agrees over NCCL too when a rank of another node found the problem, and leaves the warning to it."""
    fake = FakeNcclGroup(monkeypatch, elsewhere=True)
    monkeypatch.setattr(distributed, "host_addresses", resolver("10.1.2.3"))
    assert distributed.host_agreement(torch.device("cpu")) == (None, torch.device("cpu"))
    assert fake.new_groups == [] and len(recwarn) == 0


# ---------------------------------------------------------------------------- on GPUs only
def _nccl_in_callers_group(rank: int, world: int, store_path: str, results) -> None:
    for name in LAUNCH_VARIABLES:
        os.environ.pop(name, None)
    dist.init_process_group("nccl", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        env = distributed.setup("cuda")
        distributed.barrier(env)
        objects = distributed.gather_objects(str(env.device), env)
        total = distributed.all_reduce(torch.ones(1, device=env.device), env)
        agreed = distributed.host_max([float(rank), 1.0], env)
        results[rank] = (str(env.device), torch.cuda.current_device(), objects, total.item(), agreed)
    finally:
        dist.destroy_process_group()


@TWO_GPUS
def test_nccl_collectives_in_a_group_the_caller_made_run_on_distinct_gpus(tmp_path):
    """Two `mp.spawn` processes with their own NCCL group: each on its GPU, current device included,
    and the barrier, object gather, all-reduce and host agreement all run (no "Duplicate GPU")."""
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_nccl_in_callers_group, args=(2, str(tmp_path / "store"), results), nprocs=2, join=True)
        seen = dict(results)
    for rank in (0, 1):
        assert seen[rank] == (f"cuda:{rank}", rank, ["cuda:0", "cuda:1"], 2.0, [1.0, 1.0])


def _agree_over_nccl_on_one_gpu(rank: int, store_path: str, results) -> None:
    import dataclasses

    for name in LAUNCH_VARIABLES:
        os.environ.pop(name, None)
    distributed.gloo_loopback_problem = lambda *args, **kwargs: "a loopback host name (forced)"
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
    """Where gloo cannot be used, host_max goes over the NCCL group on the GPU (float64 there) and
    gives back Python floats."""
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_agree_over_nccl_on_one_gpu, args=(str(tmp_path / "store"), results), nprocs=1, join=True)
        seen = dict(results)
    assert seen == {0: (None, "cuda:0", [3.5, 1.0])}
