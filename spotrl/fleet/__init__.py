"""The rollout fleet: how many rollout workers an iteration should use, and what a fleet would do.

    fleet_model.py  FleetModel: the numbers a fleet is described by (workload, worker and trainer
                    speeds, cold start, network, prices, preemptions), and a long-tailed example
    sizing.py       the analytic iteration time and cost of W workers, and the cost-aware choice of W
                    (least cost within a deadline, or least time within a budget); policies by name
    simulator.py    a discrete-event simulation (simpy) of N iterations on a fleet of W rollout workers
                    plus the trainer: weight publish and pull, staleness, cold starts, preemptions
    calibrate.py    a FleetModel from a run directory's own measurements, and the validation of the
                    simulator against that run's iteration time
    sweep.py        the table and plots `spotrl simulate` and benchmarks/fleet.py print

A library: it imports the config and storage only, so the flow (which asks the policy before each
iteration) and the CLI both sit above it.
"""
