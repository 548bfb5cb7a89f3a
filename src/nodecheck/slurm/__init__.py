"""The Slurm face: the prolog and health check, scontrol, and the proximity of a job's peers."""
