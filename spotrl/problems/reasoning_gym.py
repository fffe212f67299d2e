"""Procedural reasoning tasks from reasoning-gym: prompts from its generators, rewards from its
own scoring functions (the `reasoning_gym` verifier, spotrl/rewards/rgym.py).

    problem:
      name: reasoning_gym
      reasoning_gym:
        datasets:
          - {name: chain_sum, weight: 2, options: {min_terms: 2, max_terms: 3}}
          - {name: leg_counting, weight: 1}

`problem.train_size + problem.eval_size` rows are generated, split over the datasets by weight,
each dataset seeded from (run seed, its position, its name), offline. They are curated like
dataset sources (RUN/curation/generated/<dataset>.jsonl in, quarantine, exact and normalised dedup,
so the held-out split shares no prompt with the training split, mixing by weight, manifest). A row's
reference (its `answer`) is the JSON {dataset, options, entry}: what score_answer needs; the entry's
own answer is the warm-start target of the built-in model (rows whose answer it cannot write have
none). Names and options are checked when the config is built, against reasoning-gym's registry.
"""

from __future__ import annotations

import json
import math

from spotrl.model.tokenizers import TEXT_ALPHABET, BucketedCharTokenizer
from spotrl.problems.spec import GeneratedSource, Problem, register
from spotrl.rng import derive_numpy_rng

RESERVED_OPTIONS = ("seed", "size")  # the run decides them


def _registry() -> dict:
    from reasoning_gym.factory import DATASETS

    return DATASETS


def check_dataset(name: str, options: dict, key: str) -> None:
    """Raises ValueError naming `key` when reasoning-gym has no dataset `name` or refuses `options`."""
    datasets = _registry()
    if name not in datasets:
        raise ValueError(f"{key}.name: no reasoning-gym dataset {name!r}; known: {', '.join(sorted(datasets))}")
    reserved = sorted(set(options) & set(RESERVED_OPTIONS))
    if reserved:
        raise ValueError(f"{key}.options: {reserved} are set by the run (problem sizes and seed), not here")
    config_class = datasets[name][1]
    try:
        config = config_class(**options)
        config.validate()
    except (TypeError, ValueError, AssertionError) as err:
        raise ValueError(f"{key}.options: reasoning-gym {name!r} refuses {options}: {err}") from None


def _check_config(config) -> None:
    datasets = config.problem.reasoning_gym.datasets
    if not datasets and not config.curation.sources:
        raise ValueError("problem.reasoning_gym.datasets: name at least one reasoning-gym dataset")
    for i, d in enumerate(datasets):
        check_dataset(d.name, d.options, f"problem.reasoning_gym.datasets.{i}")


def dataset_seed(seed: int, index: int, name: str) -> int:
    return int(derive_numpy_rng(seed, f"reasoning_gym/{index}/{name}").integers(2**31))


def _jsonable(value):
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def reference(dataset: str, options: dict, entry: dict) -> str:
    """The row's reference: what the `reasoning_gym` verifier gives score_answer."""
    return json.dumps({"dataset": dataset, "options": options, "entry": entry}, sort_keys=True, default=_jsonable)


def generate(problem_cfg, seed: int) -> list[GeneratedSource]:
    import reasoning_gym

    datasets = problem_cfg.reasoning_gym.datasets
    total = problem_cfg.train_size + problem_cfg.eval_size
    mass = sum(d.weight for d in datasets)
    names = [d.name for d in datasets]
    out = []
    for i, d in enumerate(datasets):
        name = d.name if names.count(d.name) == 1 else f"{d.name}.{i}"  # a source name per entry
        size = math.ceil(total * d.weight / mass)
        ds = reasoning_gym.create_dataset(d.name, size=size, seed=dataset_seed(seed, i, d.name), **d.options)
        records = []
        for j in range(size):
            entry = ds[j]
            records.append(
                {"id": f"{j:06d}", "prompt": entry["question"], "answer": reference(d.name, d.options, entry)}
            )
        out.append(GeneratedSource(name, records))
    return out


def _target(answer, metadata) -> str | None:
    """The entry's own answer, where the built-in model's alphabet can write it."""
    try:
        solution = json.loads(answer)["entry"].get("answer")
    except (TypeError, ValueError, KeyError, AttributeError):
        return None
    if not isinstance(solution, str) or not solution or set(solution) - set(TEXT_ALPHABET):
        return None
    return solution


REASONING_GYM = register(
    Problem(
        name="reasoning_gym",
        alphabet=TEXT_ALPHABET,
        tokenizer_class=BucketedCharTokenizer,
        verifier="reasoning_gym",
        reference_field="answer",
        target=_target,
        check_config=_check_config,
        generated=generate,
        reference_is_text=False,
    )
)
