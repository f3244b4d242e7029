"""Packaging facts that a fresh install relies on."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = set(project["dependencies"])
    for name, extra in project["optional-dependencies"].items():
        if name != "all":
            reqs |= set(extra)
    return {r.replace(" ", "") for r in reqs}


def test_environment_yml_matches_pyproject() -> None:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    conda_reqs = {r.replace(" ", "") for r in pip_section if not r.startswith("-e")}
    assert conda_reqs == _requirements()


def test_all_extra_covers_every_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"]) - {"all"}
    listed = re.search(r"\[(.*)\]", project["optional-dependencies"]["all"][0])
    assert listed is not None
    assert set(listed.group(1).split(",")) == extras


def test_readme_opens_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    block = lines[lines.index("```bash") + 1 : lines.index("```bash") + 3]
    assert (
        block[0].startswith("pip install torch==2.13.0 ")
        and "tgnb notebooks run quickstart" in block[0]
    )
    assert " python -m pytest" in block[1]
