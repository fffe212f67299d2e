"""The problems a run can train on, one registered `Problem` spec each (see spec.py): arithmetic,
code, math, reasoning_gym (reasoning-gym's generators and scorers), countdown (no labelled
solution). Importing the package registers them in `PROBLEMS`; this package is the registry's
provider (spotrl.registry.PROVIDERS), so `registry("problem")` finds them without importing it."""

from spotrl.problems import arithmetic, code, countdown, math, reasoning_gym  # noqa: F401  (registration)
from spotrl.problems.spec import PROBLEMS, Problem, get_problem

__all__ = ["PROBLEMS", "Problem", "get_problem"]
