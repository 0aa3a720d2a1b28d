"""DDP under a real `torchrun` with 2 gloo ranks on 127.0.0.1: gradients are averaged across ranks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gpufeed.train.distributed import pick_backend, setup_distributed

RANK_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from gpufeed.train import cleanup_distributed, fit, resnet, setup_distributed

    info = setup_distributed()
    torch.manual_seed(0)
    model = resnet("resnet18", num_classes=4)
    torch.save({k: v.detach().clone() for k, v in model.named_parameters()}, f"{sys.argv[1]}/init{info.rank}.pt")
    g = torch.Generator().manual_seed(100 + info.rank)  # each rank sees different data
    batch = [(torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 4, (4,), generator=g))]
    result = fit(model, batch, steps=1, device=info.device, verbose=False)
    assert result.world_size == 2 and info.backend == "gloo", (result, info)
    torch.save({k: v.detach().clone() for k, v in model.named_parameters()}, f"{sys.argv[1]}/rank{info.rank}.pt")
    cleanup_distributed()
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_hold_identical_weights_after_a_step(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    proc = _torchrun(script, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    w0, w1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    init = torch.load(tmp_path / "init0.pt")
    assert w0.keys() == w1.keys()
    for name in w0:
        assert torch.equal(w0[name], w1[name]), f"{name} differs between ranks"
    assert not torch.equal(w0["fc.weight"], init["fc.weight"]), "the step changed nothing"


MAX_SECONDS_SCRIPT = textwrap.dedent(
    """
    import sys, time, torch
    from torch import nn
    from gpufeed.train import cleanup_distributed, fit, setup_distributed

    info = setup_distributed()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 4))

    class LateStep(torch.optim.SGD):  # rank 1's clock runs behind, as a CUDA rank's host does
        def step(self, closure=None):
            if info.rank == 1:
                time.sleep(0.05)
            return super().step(closure)

    def endless():
        while True:
            yield torch.randn(4, 3, 8, 8), torch.randint(0, 4, (4,))

    opt = LateStep(model.parameters(), lr=0.1)
    result = fit(model, endless(), max_seconds=1.0, device="cpu", verbose=False, optimizer=opt)
    open(f"{sys.argv[1]}/steps{info.rank}", "w").write(str(result.steps))
    cleanup_distributed()
    """
)


def _torchrun(script: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script), str(tmp_path),
    ]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)


def test_max_seconds_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    # each rank judging its own clock stopped them apart: one rank's final all-reduce met the
    # other's gradients ("collective mismatch")
    script = tmp_path / "rank.py"
    script.write_text(MAX_SECONDS_SCRIPT)
    proc = _torchrun(script, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [int((tmp_path / f"steps{r}").read_text()) for r in (0, 1)]
    assert steps[0] == steps[1] > 0 and steps[0] % 10 == 0, steps


def test_a_single_process_needs_no_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    info = setup_distributed()
    assert (info.rank, info.world_size, info.backend, info.is_main) == (0, 1, None, True)


def test_world_size_without_a_rendezvous_address_says_how_to_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(RuntimeError, match=r"MASTER_ADDR and MASTER_PORT not set.*torchrun"):
        setup_distributed()


def test_a_garbled_rank_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        setup_distributed()


@pytest.mark.parametrize(
    ("gpus", "local_ranks", "backend"),
    [(0, 2, "gloo"), (1, 2, "gloo"), (2, 2, "nccl"), (8, 2, "nccl"), (1, 1, "nccl")],
)
def test_nccl_only_when_every_local_rank_has_a_gpu_of_its_own(gpus, local_ranks, backend) -> None:
    assert pick_backend(gpus, local_ranks) == backend
