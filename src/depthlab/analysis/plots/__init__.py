"""Every figure depthlab draws, one function per figure, grouped by area in the modules here.

Each function takes plain numbers (lists / arrays), writes one PNG and returns its path. Nothing
here computes a measurement. Figures are plain :class:`matplotlib.figure.Figure` objects rendered
by the Agg canvas when saved (``_base.save``): no pyplot state, no GUI backend, no backend switch
at import time, so they are written the same way in headless CI and beside an interactive session.
"""
