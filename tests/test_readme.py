"""README.md's first ten minutes, held to what they say: the install block in the order a newcomer pastes it, and the
test command's skips, each reason on screen and the CUDA tests counted as the README counts them."""

import os
import re
import subprocess
import sys

import pytest

from conftest import NO_CUDA, ROOT, cuda_available

CPU_BUILD = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_the_cpu_build_comes_first_and_leaves_a_gpu_machine_its_cuda_build():
    block = readme().split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    commands = [i for i, line in enumerate(block) if line.startswith("pip install -r requirements.txt")]
    cpu_build = [i for i, line in enumerate(block) if CPU_BUILD in line]
    assert commands and cpu_build and cpu_build[0] < commands[0], block  # read before the command that needs it
    assert all(block[i].lstrip().startswith("#") for i in cpu_build), block  # pasted as is, it installs nothing


@pytest.mark.slow
@pytest.mark.skipif(cuda_available(), reason="a machine with a GPU runs the cuda tests")
def test_the_cuda_tests_skip_on_one_line_that_the_readme_counts():
    """The README's test command, on the cuda tests alone: pyproject.toml's -rs shows the reason they skip, once for
    them all (conftest.py skips them), with the count the README states."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda"], cwd=ROOT,
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:]
    skipped = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 1 and skipped[0].endswith(f": {NO_CUDA}"), skipped
    count = int(re.match(r"SKIPPED \[(\d+)\]", skipped[0])[1])
    stated = re.findall(r"the ([\d,]+) `cuda` tests", readme())
    assert stated and all(int(n.replace(",", "")) == count for n in stated), (
        f"{count} cuda tests skip here; README.md says {stated}")
