"""Strict configuration: unknown keys, wrong types, overrides, help text."""

from dataclasses import dataclass, field

import pytest

from draftsmith import config
from draftsmith.errors import DraftsmithError


@dataclass
class Optim:
    lr: float = 1e-4
    """Peak learning rate."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """Adam betas."""


@dataclass
class Job:
    target: str = "smollm2-135m-instruct"
    """The target model."""
    max_steps: int = 100
    """Optimizer steps to run."""
    bf16: bool = True
    """Mixed precision in bfloat16."""
    mode: str | None = None
    """Optional mode."""
    optim: Optim = field(default_factory=Optim)
    """Optimizer settings."""


def test_recipe_and_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("# draftsmith x r.yaml\nmax_steps: 5\noptim:\n  lr: 0.001\n")
    job = config.load(Job, recipe, ["optim.lr=3e-4", "bf16=false", "optim.betas=[0.8,0.9]"])
    assert job.max_steps == 5 and job.optim.lr == pytest.approx(3e-4) and job.bf16 is False
    assert job.optim.betas == [0.8, 0.9]


def test_unknown_key_suggests_closest(tmp_path):
    with pytest.raises(DraftsmithError, match=r"optim\.lrr.*Did you mean 'optim\.lr'"):
        config.load(Job, None, ["optim.lrr=1"])
    with pytest.raises(DraftsmithError, match="max_step'.*max_steps"):
        config.load(Job, None, ["max_step=3"])


def test_wrong_type_names_key_and_type():
    with pytest.raises(DraftsmithError, match="'max_steps' expects int"):
        config.load(Job, None, ["max_steps=ten"])
    with pytest.raises(DraftsmithError, match="'bf16' expects bool"):
        config.build(Job, {"bf16": "yes"})
    assert config.build(Job, {"optim": {"lr": 1}}).optim.lr == 1.0  # int -> float is lossless


def test_bad_yaml_names_file_and_line(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("max_steps: 5\noptim: [1,\n  lr: 2\n")
    with pytest.raises(DraftsmithError, match=r"bad\.yaml:\d+"):
        config.load(Job, recipe)


def test_help_lists_every_field_with_default_and_doc():
    text = "\n".join(config.describe(Job))
    for needle in ["max_steps (int, default 100): Optimizer steps to run.",
                   "optim.lr (float, default 0.0001): Peak learning rate.", "optim.betas"]:
        assert needle in text


def test_flags_from_argparse():
    import argparse

    parser = argparse.ArgumentParser()
    config.add_arguments(parser, Job)
    args, rest = parser.parse_known_args(["--max-steps", "7", "--no-bf16", "optim.lr=0.5"])
    job = config.from_flags(Job, args, rest)
    assert (job.max_steps, job.bf16, job.optim.lr, job.target) == (7, False, 0.5, "smollm2-135m-instruct")
    assert "Optimizer steps to run" in parser.format_help()
