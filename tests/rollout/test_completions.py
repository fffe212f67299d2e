"""The rollout stage's library: the rollout frame."""

import numpy as np
import pandas as pd

from spotrl.rollout.completions import Completions, completions_frame


def test_completions_frame_repeats_each_prompt_over_its_group():
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
