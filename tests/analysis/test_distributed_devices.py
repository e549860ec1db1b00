"""Under torchrun, `--device auto` puts each rank on its own LOCAL_RANK GPU with nccl when CUDA is
present, and on the CPU with gloo when it is not (the device logic is mocked: no GPU needed)."""
import pytest

from headscope.loading import distributed
from headscope.loading.distributed import init_from_env, process_device


@pytest.fixture
def torchrun(monkeypatch):
    """Rank 1 of 2 on this node; records what the process group and CUDA are asked for."""
    import torch
    import torch.distributed as dist

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    calls = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: "backend" in calls)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, timeout: calls.setdefault("backend", backend))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.setdefault("cuda_device", device))
    return calls


def _cuda(monkeypatch, present: bool):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: present)


def test_auto_with_cuda_is_this_ranks_gpu_with_nccl(torchrun, monkeypatch):
    _cuda(monkeypatch, True)
    assert process_device("auto") == "cuda:1"
    assert process_device("cuda") == "cuda:1"
    assert process_device("cuda:0") == "cuda:0"  # an explicit GPU is taken as given
    assert init_from_env("auto") == (1, 2)
    assert torchrun == {"backend": "nccl", "cuda_device": "cuda:1"}


def test_auto_without_cuda_is_the_cpu_with_gloo(torchrun, monkeypatch):
    _cuda(monkeypatch, False)
    monkeypatch.setattr(distributed, "resolve_device", lambda d: "cpu" if d == "auto" else d)  # no mps either
    assert process_device("auto") == "cpu"
    assert init_from_env("auto") == (1, 2)
    assert torchrun == {"backend": "gloo"}


def test_single_process_keeps_plain_cuda(monkeypatch):
    _cuda(monkeypatch, True)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert process_device("auto") == "cuda"
    assert init_from_env("auto") == (0, 1)


def test_analyze_command_loads_on_the_ranks_gpu(torchrun, monkeypatch, tmp_path):
    """The CLI path: `headscope analyze` under torchrun with the default --device auto."""
    from typer.testing import CliRunner

    import headscope.loading.loader
    from headscope.cli import app
    from headscope.errors import HeadscopeError

    _cuda(monkeypatch, True)
    loads = []

    def fake_load(model, device=None, **kwargs):
        loads.append(device)
        raise HeadscopeError("stop here")

    monkeypatch.setattr(headscope.loading.loader, "load", fake_load)
    result = CliRunner().invoke(app, ["analyze", "some-model", "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "stop here" in result.output
    assert loads == ["cuda:1"] and torchrun == {"backend": "nccl", "cuda_device": "cuda:1"}
