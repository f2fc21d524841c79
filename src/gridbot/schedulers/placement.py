"""GridBot's placement: the bag's Rank policy orders the bags a host may run, and nothing else moves.

The paper's Algorithm 1 serves the bags whose policies match a host by their Rank on it; GridPolicy
decides which pools the overlay's planner starts pilots in for the bag (schedulers/overlay.py). This
placement adds no opinion of its own: it is the base class's defaults under the name `gridbot`.
"""

from __future__ import annotations

from gridbot.schedulers.base import Placement


class GridBotPlacement(Placement):
    """Rank as the policies say; pilots as the overlay's planner plans them; no job moves."""

    name = "gridbot"
