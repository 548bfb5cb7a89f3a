"""Bandwidth tests: host<->device copies, GPU peer-to-peer, all-reduce in the node and across nodes (NCCL on
GPUs, gloo on CPUs), nccl-tests binaries and logs, NCCL's debug output. plan.py says which apply and runs
them; nothing here imports torch at module level: workers import it in their own process (extra `bench`)."""
