"""A real job's NCCL data, read after (or while) it runs: the Inspector profiler plugin's per-rank JSON Lines
(inspector.py), and which rank holds the job back (ranks.py). Services: they read what the job wrote and name ranks;
the CLI joins them to the nodes' Reports."""
