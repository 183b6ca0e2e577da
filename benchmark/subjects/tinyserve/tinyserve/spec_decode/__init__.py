"""Speculative decoding: propose k tokens cheaply, verify them in one target forward.

proposers.py  n-gram prompt lookup and a small draft model
rejection.py  rejection sampling that keeps the target distribution (greedy: accept while argmax matches)
engine.py     SpecDecodeEngine: schedule -> propose -> verify -> roll back rejected KV -> emit
"""
