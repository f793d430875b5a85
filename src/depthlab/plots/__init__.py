"""Every figure depthlab draws, one function per figure, grouped by area in the modules here.

Matplotlib with the non-interactive Agg backend; each function takes plain numbers (lists / arrays),
writes one PNG and returns its path. Nothing here computes a measurement.
"""

import matplotlib

matplotlib.use("Agg")
