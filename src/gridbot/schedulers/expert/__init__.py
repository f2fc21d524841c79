"""ExPERT (Agmon Ben-Yehuda et al., HPDC'11): Pareto-efficient tail replication strategies.

The pure core, in the paper's order: characterize the unreliable pools from instance records
(`characterize`, section 4.3), sample the NTDMr strategy space and the static strategies to beat
(`strategy`, sections 3 and 5.3), estimate each strategy's makespan and cost by simulating the tail
(`estimate`, section 4.4), and keep the Pareto frontier and the best strategy for a utility
(`frontier`, sections 4.4 and 4.5). No I/O, no clock: times come in as arguments, random draws from a
seed. At the tail's start:

    char = characterize(records, tail_start=now, deadline=throughput_deadline)
    space = sample_space(char.tur, mr_max)
    est = estimate(char, space, Setup(tasks, unreliable, prices, ages=ages), repetitions=10, seed=seed)
    chosen = space[best(est.makespan, est.cost, utility("product"), pareto(est.makespan, est.cost))]
"""

from gridbot.schedulers.expert.characterize import (
    Characterization,
    CharacterizationError,
    InstanceRecord,
    characterize,
    from_runtimes,
)
from gridbot.schedulers.expert.estimate import Estimate, EstimateError, Setup, estimate
from gridbot.schedulers.expert.frontier import ExpressionError, Utility, best, dominating, pareto, utility
from gridbot.schedulers.expert.strategy import (
    Combine,
    NTDMr,
    Plan,
    Prices,
    StrategyValueError,
    sample_space,
    static_plans,
)

__all__ = [
    "Characterization", "CharacterizationError", "Combine", "Estimate", "EstimateError", "ExpressionError",
    "InstanceRecord", "NTDMr", "Plan", "Prices", "Setup", "StrategyValueError", "Utility", "best", "characterize",
    "dominating", "estimate", "from_runtimes", "pareto", "sample_space", "static_plans", "utility",
]
