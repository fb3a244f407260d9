"""The command-line shell around the pure core: reads files, runs the simulator, writes reports.

Everything that touches the file system, the clock or the terminal lives here; the core under
``shockwave/`` receives plain values and returns plain values.
"""
