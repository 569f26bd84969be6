"""Replication: the leader's bookkeeping of its followers (ISR), and the followers' fetchers.

``fetcher``  follower state, the ISR tracker, the replica fetchers, leader-epoch divergence and
             truncation checks (KIP-595's shape)
"""
