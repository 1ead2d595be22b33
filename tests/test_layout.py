"""The package's layout holds: the Keras layer imports nothing of the CLI's configuration
(so neither PyYAML nor the option table), and the plan and the round rules load without
TensorFlow."""

import pathlib
import re
import subprocess
import sys

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "hvdtrain"


def test_no_file_of_the_keras_layer_imports_the_clis_configuration():
    importing = [str(path.relative_to(PACKAGE)) for path in (PACKAGE / "keras").rglob("*.py")
                 if re.search(r"hvdtrain\.config\b|from hvdtrain import [^\n]*\bconfig\b",
                              path.read_text())]
    assert importing == []


def test_the_plan_and_the_round_rules_load_without_tensorflow():
    code = ("import sys\n"
            "import hvdtrain.plan, hvdtrain.rounds.rules, hvdtrain.rounds.payload\n"
            "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


def _modules() -> set[str]:
    """Every module of the package, as a path under hvdtrain/ ("rounds/periods.py")."""
    return {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
            if path.name != "__init__.py"}


def test_at_most_16_modules_stay_at_the_top_level():
    top = sorted(name for name in _modules() if "/" not in name)
    assert len(top) <= 16, top


def test_the_layout_map_of_development_md_names_every_module():
    text = (PACKAGE.parent / "docs" / "development.md").read_text()
    layout = text[text.index("## Layout"):]
    layout = layout[:layout.index("```", layout.index("```") + 3)]
    missing = sorted(name for name in _modules()
                     if not re.search(rf"(?<!\w){re.escape(pathlib.Path(name).name)}\b",
                                      layout))
    assert missing == [], "docs/development.md's layout map does not name these modules"


LONGEST_FUNCTION = 80  # lines: option tables belong in data, not in one long builder


def test_no_function_runs_past_80_lines():
    import ast

    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines})")
    assert long == []
