"""examples/quickstart.ipynb runs, every cell, against the real server on the embedded default
(nbclient with this interpreter's ipykernel), and every code cell prints something."""
from __future__ import annotations

import os

from tests.server_fixtures import ROOT

NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def test_quickstart_runs_against_the_embedded_default(embedded_server, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("AUTOGLM_BASE_URL", embedded_server.base_url + "/v1")   # the kernel inherits it
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # committed clean
    NotebookClient(nb, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) == 5
    texts = []
    for cell in code:
        assert not [o for o in cell.outputs if o.output_type == "error"], cell.outputs
        text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        assert text.strip(), cell.source
        texts.append(text)
    assert "serving SmolLM2-135M-Instruct" in texts[0]
    assert "answer: " in texts[1] and texts[1].split("answer: ")[1].split("\n")[0].strip()
    assert "chunks)" in texts[2] and int(texts[2].rsplit("(", 1)[1].split()[0]) > 1
    assert "10 replies in" in texts[3] and texts[3].count(" tokens: ") == 10
    assert "screenshot 1080x2400" in texts[4] and "takes no images here" in texts[4]
