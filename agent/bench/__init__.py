"""Bandwidth measurements (issue 3): nccl-tests logs now; host<->device, p2p and all-reduce next.
Nothing here imports torch at module level: the measurements import it lazily (extra `bench`)."""
