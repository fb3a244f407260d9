"""What the command line writes for people to read: the simulator's comparison table, metrics
files and per-job CSVs, its plots and its self-contained HTML page."""
