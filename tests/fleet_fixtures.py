"""A fleet model small enough to work out by hand (tests/fleet/test_sizing.py tabulates it)."""

from spotrl.fleet.fleet_model import FleetModel, Lengths, Market, Network, TrainerSpeed, WorkerSpeed, Workload

HAND = FleetModel(
    workload=Workload(prompts=8, group_size=2, lengths=Lengths(median=100, sigma=0.0, max_tokens=1000)),
    worker=WorkerSpeed(tokens_per_s=100, sequence_tokens_per_s=None, shard_overhead_s=1.0, cold_start_s=10.0),
    trainer=TrainerSpeed(update_s_per_token=0.001, update_fixed_s=2.0, overhead_s=0.4, cold_start_s=0.0),
    network=Network(weight_bytes=1e9, publish_bytes_per_s=1e9, pull_bytes_per_s=1e9, store_bytes_per_s=None),
    market=Market(spot_per_hour=3.6, on_demand_per_hour=7.2, trainer_per_hour=36.0, preemptions_per_hour=0.0),
)
