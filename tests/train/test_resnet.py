"""ResNets built in the package match the reference architectures."""

from __future__ import annotations

import pytest
import torch

from gpufeed.train.resnet import MODELS, resnet


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("name", "expected"),
    [("resnet18", 11_689_512), ("resnet50", 25_557_032), ("resnet152", 60_192_808)],
)
def test_parameter_count_equals_the_reference_model(name: str, expected: int) -> None:
    assert n_params(resnet(name, num_classes=1000)) == expected


def test_classifier_width_follows_num_classes() -> None:
    assert resnet("resnet18", num_classes=10).fc.out_features == 10
    assert n_params(resnet("resnet18", 10)) == 11_689_512 - 990 * 512 - 990


def test_forward_gives_one_logit_row_per_image_for_small_inputs() -> None:
    model = resnet("resnet50", num_classes=7).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 7)
    assert torch.isfinite(out).all()


def test_zero_init_residual_starts_every_block_as_identity() -> None:
    model = resnet("resnet50", zero_init_residual=True)
    last_bns = [block.bn3.weight for stage in (model.layer1, model.layer4) for block in stage]
    assert all(torch.count_nonzero(w) == 0 for w in last_bns)
    assert torch.count_nonzero(model.layer1[0].bn1.weight) > 0


def test_names_are_forgiving_about_case_and_dashes() -> None:
    assert n_params(resnet("ResNet-18")) == n_params(resnet("resnet18"))
    assert "resnet152" in MODELS


def test_unknown_model_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'resnet19'.*resnet18"):
        resnet("resnet19")
    with pytest.raises(ValueError, match="num_classes"):
        resnet("resnet18", num_classes=0)
