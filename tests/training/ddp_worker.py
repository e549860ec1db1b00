"""Run by tests/training/test_distributed.py under torchrun (two gloo processes on the CPU).

    python -m torch.distributed.run --nproc-per-node 2 tests/training/ddp_worker.py MODE MODEL OUT

MODE "record": the model at MODEL wrapped in DistributedDataParallel, one `Timeline.record`;
rank 0 saves the timeline to OUT, every rank writes OUT-rank<r>.json (its summary).
MODE "trainer": a tiny Llama trained 8 steps by a DDP `Trainer` with a `HeadscopeCallback`
writing OUT (MODEL unused).
"""
import json
import sys

import torch
import torch.distributed as dist

import headscope
from headscope.training.toy import repeated_segments, tiny_llama, train_toy

torch.set_num_threads(1)
mode, model_path, out = sys.argv[1:4]
if mode == "record":
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = headscope.load(model_path, device="cpu").model
    wrapped = torch.nn.parallel.DistributedDataParallel(model)
    timeline = headscope.Timeline(control="random-init")
    summary = timeline.record(wrapped, 0)
    if rank == 0:
        timeline.save(out)
    with open(f"{out}-rank{rank}.json", "w") as f:
        json.dump({"summary": summary, "processes": timeline.processes}, f)
    dist.destroy_process_group()
else:
    torch.manual_seed(0)
    ids, _ = repeated_segments(8 * 64, torch.Generator().manual_seed(0))
    callback = headscope.HeadscopeCallback(every=4, out=out)
    train_toy(tiny_llama(2), ids, 8, out + "-run", [callback], batch=32)
    # End together and close gloo before exiting: a process that leaves while the other's gloo
    # threads still run can abort it ("terminate called without an active exception", seen once
    # at load 4 on two cores).
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
