"""What the command line writes for people to read: the simulator's tables, metrics files,
plots and HTML page, and the documentation's reference pages rendered from the code."""
