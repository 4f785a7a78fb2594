"""The layout's rules, read from the code itself (its imports and definitions): dependencies point
one way between the packages, no function a reader has to scroll through, the top level holds only
what a user runs (the original project's script names among them)."""
import ast
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("impala", "envs", "cluster", "walle", "nets", "tools", "policy_export")
# package -> project packages it must never import (cluster/ starts processes, it does not train;
# WALL-E and the IMPALA runtime share only nets/, envs/ and policy_export/ (the export folder);
# the leaves import no system).
FORBIDDEN = {
    "cluster": {"impala", "walle", "envs", "nets", "policy_export"},
    "impala": {"cluster", "walle"},
    "walle": {"impala", "cluster"},
    "policy_export": {"impala", "cluster", "walle", "nets"},
    "envs": {"impala", "cluster", "walle", "nets", "policy_export"},
    "nets": {"impala", "cluster", "walle", "envs", "policy_export"},
    "tools": {"impala", "cluster", "walle", "envs", "nets", "policy_export"},
}
TOP_LEVEL_SCRIPTS = {"experiment.py", "run_experiment_mm_raw.py", "vtrace.py", "local_cluster.py", "multi_train.py",
                     "ppo_main.py", "ppo_parallel_main.py"}
MAX_FUNCTION_LINES = 60


def _tracked(pattern):
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", pattern], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [f for f in out.split() if os.path.exists(os.path.join(ROOT, f))]


def _imported_packages(path):
    """The project packages a module imports anywhere in its body (lazy imports included)."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + ["%s.%s" % (node.module, a.name) for a in node.names]
        else:
            continue
        found.update(n.split(".")[0] for n in names)
        found.update(n for n in names if n.count(".") == 1)  # impala.actor, as "from impala import actor"
    return found


def _modules(package):
    return [f for f in _tracked("%s/*.py" % package)]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependencies_point_one_way(package):
    wrong = ["%s imports %s" % (f, sorted(_imported_packages(f) & FORBIDDEN[package]))
             for f in _modules(package) if _imported_packages(f) & FORBIDDEN[package]]
    assert not wrong, wrong


def test_the_learner_never_imports_the_actor():
    for f in ("impala/learner.py", "impala/training.py", "impala/loss.py", "impala/monitor.py",
              "impala/batches.py", "impala/replay.py"):
        assert "impala.actor" not in _imported_packages(f), f


def test_no_function_a_reader_has_to_scroll_through():
    long = []
    for f in _tracked("*.py"):  # the benchmarks and the tests too: they are read as often as the code
        for node in ast.walk(ast.parse(open(os.path.join(ROOT, f)).read(), f)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append("%s:%d %s (%d lines)" % (f, node.lineno, node.name, n))
    assert not long, long


def test_the_top_level_holds_only_entry_points():
    top = {f for f in _tracked("*.py") if "/" not in f}
    assert top <= TOP_LEVEL_SCRIPTS, sorted(top - TOP_LEVEL_SCRIPTS)
    for package in PACKAGES:
        assert os.path.exists(os.path.join(ROOT, package, "__init__.py")), package


def test_code_names_techniques_not_seed_files():
    """Code and docs cite a platform by its name, never by the number of a file readers cannot see."""
    pattern = re.compile(r"seed[ _]?0\d\d", re.IGNORECASE)
    hits = []
    for f in _tracked("*.py") + _tracked("*.md"):
        if f.startswith("bench/results/"):
            continue  # the results log keeps its history as it was written
        for i, line in enumerate(open(os.path.join(ROOT, f)), 1):
            if pattern.search(line):
                hits.append("%s:%d" % (f, i))
    assert not hits, hits


def test_no_bench_module_shadows_an_installed_one():
    """`python bench/x.py` puts bench/ first on sys.path, so a bench module named like an installed
    package (bench/mujoco.py once) is what gymnasium's MuJoCo envs import in that process."""
    import importlib.util
    shadows = [f for f in _tracked("bench/*.py")
               if os.path.dirname(f) == "bench" and not f.endswith("__init__.py")
               and importlib.util.find_spec(os.path.basename(f)[:-3]) is not None]
    assert not shadows, shadows
