"""Parallel building blocks over torch.distributed process groups (torch-only layer).

groups: rank groups of a parallel config; comm: functional collectives; joint_attention:
Ulysses / Ring / gather_kv joint attention; linears: TP linears, SP regions, CFG combine;
launch: N local gloo ranks for tests and benches.
"""
