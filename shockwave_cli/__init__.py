"""The composition root: the ``shockwave`` command, the embedded mode and the demo.

It wires the shells together (the API with the solver service's plan requests, the round
driver, the agent) and runs the simulator on files; it is the only package that imports them
all. Everything that touches the file system, the clock or the terminal for the simulator lives
here; the core under ``shockwave/`` receives plain values and returns plain values.
"""
