"""The app's layout shows its pages: one folder of minillm_visualizer/ per page of the navigation, named like
its script and its URL; a page imports only its own folder and shared/; the app's modules come from app/,
never from an installed copy."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from app_pages import APP

PACKAGE = APP.parent / "minillm_visualizer"
SHARED = "shared"


def app_imports(path: Path) -> set[str]:
    """The folders of minillm_visualizer a file imports: {"shared", "live", ...}."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        found |= {n.split(".")[1] for n in names if n.startswith("minillm_visualizer.")}
    return found


def test_every_page_of_the_navigation_is_a_folder_with_its_page():
    pages = set(re.findall(r'\bpage\("(\w+)"', APP.read_text()))
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} - {SHARED}
    assert pages == folders, f"navigation {sorted(pages)}, folders {sorted(folders)}"
    assert all((PACKAGE / name / f"{name}.py").is_file() for name in folders)


def test_a_page_imports_only_its_own_folder_and_shared():
    wrong = [f"{path.relative_to(APP.parent)} imports minillm_visualizer.{folder}"
             for path in sorted(PACKAGE.rglob("*.py")) for folder in app_imports(path)
             if folder not in {SHARED, path.relative_to(PACKAGE).parts[0]}]
    wrong += [f"streamlit_app.py imports minillm_visualizer.{f}" for f in app_imports(APP) - {SHARED}]
    assert not wrong, "\n".join(wrong)


@pytest.mark.subprocess
def test_the_app_imports_its_modules_from_its_folder_and_nothing_is_installed(tmp_path):
    """The tests import the files under app/ (conftest puts the folder on sys.path). Run from another folder,
    with no such help, Python finds no minillm_visualizer (nothing installed one), and Streamlit still runs the
    app: it puts the script's folder on sys.path itself."""
    import minillm_visualizer
    assert Path(minillm_visualizer.__file__).parent == PACKAGE
    code = "\n".join(["import importlib.util", "from streamlit.testing.v1 import AppTest",
                      "print(importlib.util.find_spec('minillm_visualizer'))",
                      f"at = AppTest.from_file({str(APP)!r}, default_timeout=60)",
                      "at.session_state['k_model'] = 'pico'", "at.run()", "print([e.value for e in at.exception])"])
    out = subprocess.run([sys.executable, "-c", code], check=False, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["None", "[]"], out.stdout
