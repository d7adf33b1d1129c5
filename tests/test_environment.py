"""environment.yml (conda, GPU machines) and pyproject.toml (pip) must describe the same course."""

import re
import tomllib

import yaml

from .conftest import REPO
# conda names that differ from pip's
CONDA_NAME = {"torch": "pytorch"}
CUDA_TOOLCHAIN = {"cuda-nvcc", "pytorch-cuda"}


def _pip_requirements():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += extra
    return {re.split(r"[<>=!~ \[]", r, maxsplit=1)[0].lower(): r for r in reqs}


def _conda_packages():
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    specs = [d for d in env["dependencies"] if isinstance(d, str)]
    return {re.split(r"[<>=!~ ]", s, maxsplit=1)[0].lower(): s for s in specs}


def test_every_pip_requirement_is_in_the_conda_environment():
    conda = _conda_packages()
    missing = [name for name in _pip_requirements() if CONDA_NAME.get(name, name) not in conda]
    assert missing == []


def test_torch_range_agrees_and_admits_2_11_to_2_14():
    pip_torch = _pip_requirements()["torch"]
    conda_torch = _conda_packages()["pytorch"]
    for spec in (pip_torch, conda_torch):
        assert ">=2.11" in spec and "<2.15" in spec, spec


def test_conda_environment_has_the_gpu_toolchain():
    conda = _conda_packages()
    assert CUDA_TOOLCHAIN <= set(conda)
    assert {"python", "ninja", "jupyterlab", "nbgrader", "matplotlib", "pytest", "tqdm"} <= set(conda)
