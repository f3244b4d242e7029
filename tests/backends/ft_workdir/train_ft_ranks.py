"""A replica group of several processes on TorchFT's own API, with nothing of tgnb: the program of
a fault-tolerant run whose groups each run K ranks under their own torchrun
(`tests/backends/local/test_replica_groups_ranks.py`).

Inside a group, ``FT_INSIDE``: ``ddp`` (torch's ``DistributedDataParallel`` over the group's ranks)
or ``fsdp`` (torch's ``fully_shard`` over a mesh of the group's ranks: each rank holds a shard),
on the process group torchrun's environment sets up (``init_process_group("gloo")``: its
MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE). Across groups, TorchFT as its examples write it: one ``Manager``
per rank (it takes the group's rank, world size and store from the same torchrun environment;
rank 0 hosts the group's ManagerServer, the only one the lighthouse sees), TorchFT's
``Optimizer``, and the Manager's fault-tolerant allreduce of each gradient (each rank's shard,
under FSDP) over
``ProcessGroupGloo`` -- rank r of every group in one replicated process group, as in TorchFT's
HSDP layout (``dp_replicate`` across groups, the group's own ranks inside). A joining group heals
rank by rank from a live peer's rank of the same index, before its forward pass
(``use_async_quorum=False``, as TorchFT's FSDP example and tgnb's Checkpointer).

Each rank prints one JSON line per step: its group, its rank, the step after it, the groups in its
quorum; at its start its torchrun environment; at its end a checksum of its weights (every rank of
every group holds the same weights when they stop at the same step). ``FT_STEPS``: the steps to
train; ``FT_STEP_S``: the compute time of a step (a sleep); ``FT_UNTIL``: a file that, once a test
writes a step into it, ends training at that step (the same number for every rank).

The Manager's allreduce, not `torchft.DistributedDataParallel` (see ``train_ft.py``: in torchft
0.2.0 its comm hook fails when a peer dies during the allreduce)."""

import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn, optim
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
from torchft import Manager, Optimizer, ProcessGroupGloo

STEPS = int(os.environ.get("FT_STEPS", "200"))
STEP_S = float(os.environ.get("FT_STEP_S", "0.05"))  # compute time of one step (a sleep)
GROUP = int(os.environ.get("REPLICA_GROUP_ID", "0"))
UNTIL = os.environ.get("FT_UNTIL", "")
INSIDE = os.environ.get("FT_INSIDE", "ddp")  # the parallelism inside a group: ddp or fsdp
RANK = int(os.environ["RANK"])  # torchrun's: this process's rank inside its group


def last_step() -> int:
    """`STEPS`, or the step a test wrote into ``FT_UNTIL``'s file (read at each step)."""
    try:
        with open(UNTIL, encoding="utf-8") as f:
            return min(STEPS, int(f.read()))
    except (OSError, ValueError):  # no knob, not written yet, or written halfway
        return STEPS


def say(**line: object) -> None:
    print(json.dumps({"group": GROUP, "rank": RANK, **line}), flush=True)


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # the group's own ranks
    world = dist.get_world_size()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    if INSIDE == "fsdp":  # sharded over the group's ranks; its state a peer sends is sharded too
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
        for layer in (net[0], net[2], net):
            fully_shard(layer, mesh=mesh)
        model: nn.Module = net
    else:
        model = DistributedDataParallel(net)
    inner = optim.SGD(model.parameters(), lr=0.01)

    def state_dict() -> dict:
        return {"model": net.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd: dict) -> None:
        net.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
        min_replica_size=1,
        # the quorum (and a heal) before the forward pass: with TorchFT's asynchronous quorum
        # (its default) a group's ranks ended with different weights, even with no failure
        # (rank 0 of every group alike, rank 1 alike: they parted at the first step)
        use_async_quorum=False,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"group_{GROUP}",
        timeout=timedelta(seconds=10),
    )
    opt = Optimizer(manager, inner)
    gen = torch.Generator().manual_seed(GROUP * world + RANK)
    torchrun = {
        k.lower(): os.environ.get(k) for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT")
    }
    say(started=time.time(), pid=os.getpid(), inside=INSIDE, lighthouse=os.environ.get("TORCHFT_LIGHTHOUSE"),
        groups=os.environ.get("NUM_REPLICA_GROUPS"), **torchrun)  # fmt: skip
    while manager.current_step() < last_step():
        x = torch.randn(16, 32, generator=gen)
        opt.zero_grad()  # starts the quorum
        loss = model(x).pow(2).mean()
        loss.backward()  # DDP averages the gradients over the group's ranks; FSDP reduces shards
        time.sleep(STEP_S)  # the rest of a step's compute
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]  # FSDP: the shard
        works = [manager.allreduce(g) for g in grads]
        for work in works:
            work.wait()  # False when a peer failed: the step is then not committed
        opt.step()  # commits when every rank of every group in the quorum agrees
        say(step=manager.current_step(), participants=manager.num_participants(), t=time.time())
    whole = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in net.parameters()]
    checksum = sum(float(p.detach().double().sum()) for p in whole)  # FSDP: gathered
    say(done=manager.current_step(), checksum=checksum, inside=INSIDE, t=time.time())
    manager.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
