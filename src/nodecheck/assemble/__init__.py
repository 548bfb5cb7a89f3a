"""Derived facts: the probes' facts fused into one Report, path specs, rails, which kernel-log events are
open, the GID NCCL takes, the fingerprint, binding advice. Pure: reads the Report and the config."""
