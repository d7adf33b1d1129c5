"""Run notebook cells the way nbgrader does (nbclient, a real ipykernel), and read what each cell wrote."""

import os

import nbformat
from nbclient import NotebookClient


def run_cells(sources, timeout=600, env=None, cwd=None):
    """Execute ``sources`` as code cells in a fresh kernel; return the executed notebook."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in sources]
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                                resources={"metadata": {"path": cwd or os.getcwd()}})
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return nb


def streams(nb, name):
    """The text each cell wrote to stream ``name`` ("stdout" or "stderr"), keyed by cell index."""
    found = {}
    for index, cell in enumerate(nb.cells):
        text = "".join(o.get("text", "") for o in cell.get("outputs", [])
                       if o.get("output_type") == "stream" and o.get("name") == name)
        if text:
            found[index] = text
    return found


def errors(nb):
    return {i: f"{o['ename']}: {o['evalue']}" for i, cell in enumerate(nb.cells)
            for o in cell.get("outputs", []) if o.get("output_type") == "error"}
