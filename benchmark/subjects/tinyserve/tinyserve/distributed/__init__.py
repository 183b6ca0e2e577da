"""Tensor parallelism over torch.distributed (gloo): one process per rank, rank 0 drives.

parallel_state.py  this process's rank, the collectives the layers use
layers.py          row-parallel linear (all-reduce), vocab-parallel embedding and logits (gather)
loader.py          a rank's shard of the model: sharded config, parameter slices
runner.py          TPModelRunner: rank 0 spawns the other ranks and mirrors every forward to them

Column-parallel projections need no code of their own: a rank's model is built
from a config with num_heads / tp, num_kv_heads / tp and intermediate_size / tp,
and the loader hands each rank its rows of q, k, v, gate and up.
"""
