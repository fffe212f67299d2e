"""spotrl: preemptible reinforcement learning for LLMs on JAX/Flax, orchestrated by Prefect."""

__version__ = "0.3.0"
