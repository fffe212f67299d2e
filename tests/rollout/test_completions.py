"""The rollout stage's library: the rollout frame, a planned round's shard frame and number."""

import numpy as np
import pandas as pd

from spotrl.rollout.completions import Completions, completions_frame, round_frame, shard_number


def _two_prompts_two_samples():
    prompts = pd.DataFrame({"id": ["a", "b"], "prompt": ["1+1=", "2+2="], "answer": ["2", "4"]})
    completions = Completions(
        prompt_tokens=np.zeros((4, 1)),
        prompt_valid=np.ones((4, 1), bool),
        tokens=np.arange(8).reshape(4, 2),
        logprobs=np.zeros((4, 2), np.float32),
        lengths=np.array([2, 1, 2, 0]),
        texts=["2", "3", "4", ""],
        stopped=np.array([True, False, True, False]),
    )
    return prompts, completions


def test_completions_frame_repeats_each_prompt_over_its_group():
    prompts, completions = _two_prompts_two_samples()
    frame = completions_frame(prompts, completions, 2, weights_version=7)
    assert list(frame["prompt_id"]) == ["a", "a", "b", "b"] and list(frame["answer"]) == ["2", "2", "4", "4"]
    assert list(frame["sample"]) == [0, 1, 0, 1] and list(frame["weights_version"]) == [7] * 4
    assert list(frame.columns) == [
        "prompt_id",
        "prompt",
        "answer",
        "sample",
        "completion",
        "tokens",
        "logprobs",
        "length",
        "stopped",
        "weights_version",
    ]
    np.testing.assert_array_equal(frame["tokens"][2], [4, 5])


def test_round_frame_marks_each_row_with_its_round_and_its_prompt_slot():
    prompts, completions = _two_prompts_two_samples()
    frame = round_frame(prompts, completions, 2, weights_version=3, generation_round=1, positions=[5, 2])
    assert list(frame["slot"]) == [5, 5, 2, 2] and list(frame["round"]) == [1] * 4
    assert list(frame.columns[-2:]) == ["round", "slot"]
    assert [shard_number(s, r, 3) for r in (0, 1) for s in range(3)] == [0, 1, 2, 3, 4, 5]
