"""Human output, split by command family: table (what all share), report (inspect), bench (bench and
nccl-log), scale, slurm (prolog, healthcheck, config check)."""
