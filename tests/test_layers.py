"""The house's layers, as README.md's reading order states them: imports run one way, down. A module imports only
modules of a lower layer, or of its own folder; engine/ imports nothing of the model, the data or the configs; and
data.py and plot.py load without torch."""

import ast
import glob
import os
import subprocess
import sys

from conftest import ROOT

# from the bottom up; a name is a top-level module or a folder of modules
LAYERS = ["engine", "norms", "model", "presets", "data", "diagnostics", "configs", "train", "lab", "sample", "sweep",
          "plot"]


def house_modules():
    """{module path relative to the root: its layer} of every Python file but the tests."""
    paths = [*glob.glob(os.path.join(ROOT, "*.py")), *glob.glob(os.path.join(ROOT, "*", "*.py"))]
    modules = {}
    for path in sorted(paths):
        relative = os.path.relpath(path, ROOT)
        name = relative.split(os.sep)[0].removesuffix(".py")
        if name in ("tests", "conftest") or name.startswith("test_"):
            continue
        modules[relative] = name
    return modules


def imported_layers(path):
    """The layers of the house that the file at path imports (any import, at any depth of the file)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.append(node.module)
    return {name.split(".")[0] for name in names} & set(LAYERS)


def upward_imports():
    """"module (layer) imports X" for each import of a layer not below the module's own."""
    found = []
    for relative, layer in house_modules().items():
        for imported in sorted(imported_layers(os.path.join(ROOT, relative))):
            if imported != layer and LAYERS.index(imported) >= LAYERS.index(layer):
                found.append(f"{relative} ({layer}) imports {imported}")
    return found


def test_imports_run_down_the_layers_and_data_and_plot_load_without_torch():
    """engine < norms < model < presets < data < diagnostics < configs < train < lab < the commands (sample, sweep,
    plot), every module in a layer; and with torch made unimportable, data.py and plot.py load with all they import."""
    assert set(house_modules().values()) <= set(LAYERS), "a new module: give it a layer in LAYERS and README.md"
    assert upward_imports() == []
    for module in ("data", "plot"):
        code = f"import sys; sys.modules['torch'] = None; import {module}"
        result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 0, f"{module}: {result.stderr.strip().splitlines()[-1]}"


def test_model_imports_nothing_of_the_house_but_norms():
    """model.py is read as the model alone: its flags' ranges are its own declarations, not the command line's."""
    assert imported_layers(os.path.join(ROOT, "model.py")) == {"norms"}


def imported_modules(path):
    """The dotted names of the modules the file at path imports (from X import Y counts X)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
    return names


def test_arrows_go_by_meaning():
    """What two layers share lives in the lower one: the benchmark times model.py's optimizer, not train.py's; the
    pool of runs and the sweep read a run from lab/runs.py, not from the summary; the instruments log through the
    logger train.py hands them, not by writing the run folder themselves."""
    assert "train" not in imported_modules(os.path.join(ROOT, "lab", "bench.py"))
    assert "lab.summary" not in imported_modules(os.path.join(ROOT, "lab", "pool.py"))
    assert "engine.run_folder" not in imported_modules(os.path.join(ROOT, "diagnostics", "instruments.py"))
