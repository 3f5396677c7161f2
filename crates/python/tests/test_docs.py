"""The Python guide (docs/python.md) and the README's tour as a user runs them: each ```python block, in order,
against a real master (their `127.0.0.1:50051` is this session's master)."""

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[3]


def python_blocks(text: str) -> list:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def run_blocks(rel: str, master: str) -> None:
    blocks = python_blocks((REPO / rel).read_text())
    assert blocks, f"{rel} has no python block"
    for i, block in enumerate(blocks):
        code = compile(block.replace("127.0.0.1:50051", master), f"{rel} block {i + 1}", "exec")
        exec(code, {"__name__": f"docs_python_{i}"})


def test_the_python_guides_code_runs_as_written(master):
    run_blocks("docs/python.md", master)


def test_the_readmes_python_tour_runs_as_written(master):
    run_blocks("README.md", master)
