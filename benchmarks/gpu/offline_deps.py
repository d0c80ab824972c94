"""dlx's dependencies for a GPU machine without network: wheels downloaded here, unpacked there.

A lent device machine has its own torch (a CUDA build, Python 3.12) but not the packages `python -m dlx bench`
imports, and it cannot reach PyPI. Before a device run, on a machine that can:

    .venv/bin/python benchmarks/gpu/offline_deps.py download

runs (the versions pinned to the ones installed in this environment, which the tests ran with):

    pip download --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 \\
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --dest benchmarks/gpu/wheels \\
        numpy==V safetensors==V pydantic==V pyyaml==V typer==V rich==V psutil==V matplotlib==V ijson==V zstandard==V
    pip download (the same options) --no-deps tokenizers==V torchao==V \\
        torchtitan==V spmd-types==V tyro==V docstring-parser==V torchdata==V

and prints the folder's size, under the 64 MiB (67.1 MB) the device tool carries for git-ignored paths
(`benchmarks/gpu/wheels/` is ignored): dlx's wheels with torchao 60.3 MB, torchtitan's five 1.7 MB (torchtitan 1.27,
tyro 0.22, spmd-types 0.12, torchdata 0.06, docstring-parser 0.02), 62.0 MB in all. Only what `dlx bench` imports:
tiktoken and pyarrow (used by `dlx prepare` alone) are left out, and so are tokenizers' own dependencies
(huggingface_hub and what it needs: 8 MB), which serve `Tokenizer.from_pretrained` alone, a call dlx never makes.
torchtitan's declared dependencies (Hugging Face Datasets with pyarrow and pandas, TensorBoard with grpcio, wandb,
pillow, einops, torch_checkpointing: about 490 MB installed) are left out but for the four its trainer imports on the
dense Llama path; benchmarks/peers/titan.py stands in for the imports of the rest, which that path never calls.

On the device machine `unpack_missing` extracts each wheel whose distribution that Python lacks into a folder that is
put on PYTHONPATH; what the image already has (numpy, typing-extensions, ...) is kept. A wheel is a zip of the files
`pip install` would copy; the console scripts and installer records pip adds are not needed by `python -m dlx`. No
pip, no network, nothing written outside that folder.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / "benchmarks" / "gpu" / "wheels"
BENCH_DISTRIBUTIONS = (
    *("numpy", "safetensors", "pydantic", "pyyaml", "typer", "rich", "psutil", "matplotlib"),
    *("ijson", "tokenizers", "zstandard"),  # imported with train.model_build (init_from -> HF tokenizers -> prepare)
)
"""dlx's core dependencies that `python -m dlx bench` imports (checked by
tests/integration/test_gpu_bench_script.py)."""
DEVICE_EXTRAS = ("float8",)
"""dlx extras a device run needs beside them: torchao for next_contact's float8 step (the image has none)."""
PEER_DISTRIBUTIONS = ("torchtitan", "spmd-types", "tyro", "docstring-parser", "torchdata")
"""next_contact's torchtitan row: torchtitan's wheel and the four of its dependencies its dense Llama trainer imports
(benchmarks/peers/titan.py stands in for the rest: Hugging Face Datasets, TensorBoard; the image has Triton)."""
NO_DEPS = ("tokenizers", "torchao", *PEER_DISTRIBUTIONS)
"""Downloaded without their dependencies (see the module docstring)."""
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
CARRY_LIMIT_MB = 64 * 1.048576
"""The device tool carries at most 64 MiB of git-ignored paths."""


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them: `PyYAML` = `pyyaml`, `typing_extensions` = `typing-extensions`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def bench_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The pyproject requirements (with their version bounds) of the distributions `dlx bench` imports."""
    import tomllib  # Python 3.11+: the download runs on the development machine

    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    wanted = {normalize(name) for name in BENCH_DISTRIBUTIONS}
    return [req for req in dependencies if normalize(requirement_name(req)) in wanted]


def extra_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The requirements of DEVICE_EXTRAS, as pyproject bounds them (torchao: one abi3 wheel, no dependencies)."""
    import tomllib

    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    return [req for extra in DEVICE_EXTRAS for req in extras[extra]]


def peer_requirements() -> list[str]:
    """PEER_DISTRIBUTIONS, at the versions installed here (pinned() pins them; the bench extra names torchtitan)."""
    return list(PEER_DISTRIBUTIONS)


def pinned(requirements: list[str]) -> list[str]:
    """Each requirement as `name==version` of this environment's installed copy (unchanged where it is missing)."""
    result = []
    for requirement in requirements:
        name = requirement_name(requirement)
        version = installed_version(name)
        result.append(f"{name}=={version}" if version else requirement)
    return result


def download_commands(dest: Path, requirements: list[str], python_version: str = "3.12") -> list[list[str]]:
    """The pip download lines: the requirements with their dependencies, then those of NO_DEPS without."""
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    pip = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", python_version]
    pip += ["--implementation", "cp", *platforms, "--dest", str(dest)]
    alone = [req for req in requirements if normalize(requirement_name(req)) in NO_DEPS]
    return [[*pip, *(req for req in requirements if req not in alone)], [*pip, "--no-deps", *alone]]


def requirement_name(requirement: str) -> str:
    """`numpy>=1.24` -> `numpy`."""
    return re.split(r"[<>=!~ \[;]", requirement, maxsplit=1)[0]


def folder_mb(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.glob("*.whl")) / 1e6


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def wheel_distribution(path: Path) -> tuple[str, str]:
    """(normalized name, version) from a wheel's file name: `{name}-{version}(-{build})?-{python}-{abi}-{platform}`."""
    parts = path.name.removesuffix(".whl").split("-")
    if len(parts) not in (5, 6):
        raise ValueError(f"{path.name} is not a wheel file name")
    return normalize(parts[0]), parts[1]


def unpack_plan(wheel_dir: Path) -> list[tuple[Path, str | None]]:
    """Each wheel with the version of its distribution this Python already has (None: it will be unpacked)."""
    return [(wheel, installed_version(wheel_distribution(wheel)[0])) for wheel in sorted(wheel_dir.glob("*.whl"))]


def unpack_missing(wheel_dir: Path, target: Path) -> list[str]:
    """Extract every wheel whose distribution is missing here into `target`; returns the wheels' file names."""
    target.mkdir(parents=True, exist_ok=True)
    unpacked = []
    for wheel, present in unpack_plan(wheel_dir):
        if present is None:
            extract_wheel(wheel, target)
            unpacked.append(wheel.name)
    return unpacked


def extract_wheel(wheel: Path, target: Path) -> None:
    """The wheel's files under `target`; `NAME.data/purelib` and `platlib` go to the top, as pip installs them."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            parts = Path(member.filename).parts
            if any(part == ".." for part in parts) or Path(member.filename).is_absolute():
                raise ValueError(f"{wheel.name}: unsafe path {member.filename!r}")
            if len(parts) > 2 and parts[0].endswith(".data"):
                if parts[1] not in ("purelib", "platlib"):
                    continue  # scripts, headers, data: not needed to import
                parts = parts[2:]
            destination = target.joinpath(*parts)
            if member.is_dir():
                destination.mkdir(parents=True, exist_ok=True)
                continue
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(archive.read(member))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("download", "plan"), help="download the wheels here, or show what unpacks")
    parser.add_argument("--dest", type=Path, default=WHEELS)
    parser.add_argument("--python-version", default="3.12", help="the device machine's Python")
    args = parser.parse_args()
    if args.action == "plan":
        for wheel, present in unpack_plan(args.dest):
            print(f"{wheel.name}: {'present (' + present + ')' if present else 'unpack'}")
        return
    for command in download_commands(
        args.dest, pinned(bench_requirements() + extra_requirements() + peer_requirements()), args.python_version
    ):
        print("$ " + " ".join(command), flush=True)
        subprocess.run(command, check=True)
    size = folder_mb(args.dest)
    print(f"{args.dest}: {size:.1f} MB of wheels (the device tool carries at most {CARRY_LIMIT_MB:.1f} MB)")
    if size > CARRY_LIMIT_MB:
        sys.exit(f"error: {args.dest} is over the carry limit; remove wheels of other versions from it")


if __name__ == "__main__":
    main()
