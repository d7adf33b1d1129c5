"""The clean recheck's processes load the plotting modules only when a cell uses them (``lazy_plots``)."""

import subprocess
import sys

SCRIPT = r"""
import sys
from fuselab.grading.recheck import lazy_plots
lazy_plots.defer()
import matplotlib.pyplot as plt          # as every lab's setup cell imports them
from fuselab import plots
import fuselab.plots
assert "matplotlib.figure" not in sys.modules and "matplotlib.patches" not in sys.modules, "loaded at import"
fig, ax = plt.subplots()                  # a cell that draws: the real modules, through the names it bound
assert type(fig).__name__ == "Figure" and callable(plots.plot_bytes)
from matplotlib.pyplot import figure
assert plt.figure is figure and sys.modules["matplotlib.pyplot"] is not plt
assert fuselab.plots.plot_bytes is plots.plot_bytes
print("ok")
"""


def test_plotting_modules_load_on_first_use_and_then_work_as_before():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    assert done.stderr == ""  # nothing on stderr: a graded cell's stderr fails it
