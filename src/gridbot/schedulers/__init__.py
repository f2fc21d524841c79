"""Strategies that steer the core: replication, economy, hierarchy, expert, selection."""
