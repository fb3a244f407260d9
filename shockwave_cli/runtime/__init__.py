"""The service run on one machine: the embedded deployment (``shockwave up``), the demo, the
replay of a trace through the real service, throwaway databases and the supervision of the
processes they start."""
