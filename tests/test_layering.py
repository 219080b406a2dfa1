"""Module boundaries: no module uses another module's private (`_name`) helpers, and no module
under dllm/, samplers/, kernels/ shadows a public function of its package."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("dllm", "samplers", "kernels", "benchmarks")
OURS = ("dllm", "samplers", "kernels")


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _ours(module: str | None, level: int) -> bool:
    return level > 0 or (module or "").split(".")[0] in OURS


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, text) of every `from <ours> import _name` and `<name imported from ours>._name`."""
    tree = ast.parse(source)
    found, imported = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _ours(node.module, node.level):
            for alias in node.names:
                if _is_private(alias.name):
                    found.append((node.lineno, f"from {'.' * node.level}{node.module or ''} import {alias.name}"))
                imported.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] in OURS}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in imported:
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_check_finds_private_uses():
    src = "from dllm.eval import runner\nfrom .x import _y\nimport dllm\nrunner._Dist()\ndllm.models._z\n"
    assert sorted(line for line, _ in private_uses(src)) == [2, 4, 5]
    assert private_uses("import os\nos._exit\nfrom typing import _T\nclass A:\n    def f(self): self._a\n") == []


def test_no_module_uses_another_modules_private_names():
    found = [f"{path.relative_to(ROOT)}:{line}: {text}"
             for folder in CHECKED for path in sorted((ROOT / folder).rglob("*.py"))
             for line, text in private_uses(path.read_text(encoding="utf-8"))]
    assert found == []


def test_the_loop_module_does_not_shadow_the_generate_function():
    import dllm

    assert callable(dllm.generate) and not (ROOT / "dllm" / "generate.py").exists()
